//! Test helpers: scratch directories and fake servers (shell scripts that answer
//! `--version`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A directory removed when the test ends.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory under the system temp dir.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pglease-binaries-test-{name}-{:016x}",
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A shell script that prints `postgres (PostgreSQL) <version>` for `--version`.
pub(crate) fn fake_postgres_script(version: &str) -> String {
    format!("#!/bin/sh\necho 'postgres (PostgreSQL) {version}'\n")
}

/// Writes an executable file.
pub(crate) fn write_executable(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, content).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Makes `dir` a fake server bin directory reporting `version`.
pub(crate) fn fake_server(dir: &Path, version: &str) {
    write_executable(&dir.join("postgres"), &fake_postgres_script(version));
    write_executable(&dir.join("initdb"), "#!/bin/sh\nexit 0\n");
}
