//! What the packages and the deploy files say about the project agrees with `Cargo.toml`:
//! one home (README.md, "Where it lives"), named by the crates, the Go module path, the
//! Python and Node packages; and the image compose and the Kubernetes manifests run is the
//! version's tag, the one `release/image.sh` saves. The Go helper is fetched by `go get` from
//! the module proxy directory `release/go.sh` writes, as a user's module would.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::tool_available;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|e| panic!("read {relative}: {e}"))
}

fn toml_file(relative: &str) -> toml::Table {
    read(relative)
        .parse()
        .unwrap_or_else(|e| panic!("{relative} is not TOML: {e}"))
}

fn string<'a>(table: &'a toml::Table, path: &[&str]) -> &'a str {
    let mut value = table.get(path[0]).unwrap_or_else(|| panic!("no {path:?}"));
    for key in &path[1..] {
        value = value.get(*key).unwrap_or_else(|| panic!("no {path:?}"));
    }
    value
        .as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string"))
}

/// The workspace's `[workspace.package]`: the version and the home every package names.
fn workspace() -> toml::Table {
    toml_file("Cargo.toml")
}

fn version() -> String {
    string(&workspace(), &["workspace", "package", "version"]).to_owned()
}

fn home() -> String {
    string(&workspace(), &["workspace", "package", "repository"]).to_owned()
}

/// The manifests of the root package and of every workspace member, by path.
fn manifests() -> Vec<String> {
    let workspace = workspace();
    let members = workspace["workspace"]["members"]
        .as_array()
        .expect("workspace.members");
    let mut paths = vec!["Cargo.toml".to_owned()];
    for member in members {
        let member = member.as_str().expect("a member's path");
        paths.push(format!("{member}/Cargo.toml"));
    }
    paths
}

/// The section of README.md that says where the project lives.
fn readme_home_section() -> String {
    let readme = read("README.md");
    let start = readme
        .find("\n## Where it lives\n")
        .expect("README.md has a section \"## Where it lives\"");
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_owned()
}

#[test]
fn every_package_names_the_one_home() {
    let home = home();
    let version = version();
    assert!(
        home.starts_with("https://github.com/"),
        "the home is a GitHub repository, as the Go module path says: {home}"
    );
    let workspace = workspace();
    assert_eq!(
        string(&workspace, &["workspace", "package", "homepage"]),
        home
    );

    // Every crate that is published inherits both; the names go into the README's list.
    let mut crates = Vec::new();
    for path in manifests() {
        let manifest = toml_file(&path);
        let package = manifest["package"].as_table().expect("[package]");
        if package.get("publish").and_then(toml::Value::as_bool) == Some(false) {
            continue;
        }
        for key in ["repository", "homepage"] {
            assert_eq!(
                package.get(key).and_then(|v| v.get("workspace")),
                Some(&toml::Value::Boolean(true)),
                "{path}: {key}.workspace = true (the home is said once, in [workspace.package])"
            );
        }
        crates.push(package["name"].as_str().expect("name").to_owned());
    }
    assert!(crates.len() >= 4, "published crates: {crates:?}");

    // Go: the module path is the home's host and path, then the subdirectory.
    let go_mod = read("clients/go/go.mod");
    let module = go_mod
        .lines()
        .find_map(|line| line.strip_prefix("module "))
        .expect("go.mod's module line")
        .trim()
        .to_owned();
    let home_path = home.strip_prefix("https://").expect("an https URL");
    assert_eq!(
        module,
        format!("{home_path}/clients/go"),
        "clients/go/go.mod"
    );

    // Python: every URL is the home or below it, and it names the home itself.
    let pyproject = toml_file("clients/python/pyproject.toml");
    let urls = pyproject["project"]["urls"]
        .as_table()
        .expect("pyproject.toml: [project.urls]");
    for (name, url) in urls {
        let url = url.as_str().expect("a URL");
        assert!(
            url == home || url.starts_with(&format!("{home}/")),
            "pyproject.toml: {name} = {url} is not under {home}"
        );
    }
    assert_eq!(
        urls.get("Repository").and_then(toml::Value::as_str),
        Some(home.as_str())
    );
    let python_name = string(&pyproject, &["project", "name"]);

    // Node: the repository is the home's git URL, and its directory is where package.json is.
    let package: Value = serde_json::from_str(&read("clients/node/package.json"))
        .expect("clients/node/package.json is JSON");
    assert_eq!(
        package["repository"]["url"].as_str(),
        Some(format!("git+{home}.git").as_str()),
        "package.json: repository.url"
    );
    assert_eq!(
        package["repository"]["directory"].as_str(),
        Some("clients/node"),
        "package.json: repository.directory"
    );
    for key in ["homepage", "bugs"] {
        let url = package[key].as_str().unwrap_or_default();
        assert!(
            url.starts_with(&format!("{home}/")),
            "package.json: {key} = {url:?} is not under {home}"
        );
    }
    let node_name = package["name"].as_str().expect("package.json: name");

    // The README says all of it in one section.
    let section = readme_home_section();
    let mut expected = vec![
        home.clone(),
        format!("`{module}`"),
        "`clients/go/vX.Y.Z`".to_owned(),
        format!("{module}@v{version}"),
        format!("`clients/go/v{version}`"),
        format!("`{python_name}`"),
        format!("`{node_name}`"),
    ];
    expected.extend(crates.iter().map(|name| format!("`{name}`")));
    for text in expected {
        assert!(
            section.contains(&text),
            "README.md's \"Where it lives\" does not say {text}:\n{section}"
        );
    }
}

/// Every text file of the checkout, outside build output and installed dependencies.
fn tree_files(dir: &Path, out: &mut Vec<PathBuf>) {
    const SKIPPED: [&str; 6] = [
        "target",
        "node_modules",
        ".git",
        "out",
        "__pycache__",
        ".schemathesis",
    ];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if !SKIPPED.iter().any(|skipped| name == *skipped) {
                tree_files(&path, out);
            }
        } else if kind.is_file() && entry.metadata().is_ok_and(|m| m.len() < 1 << 20) {
            out.push(path);
        }
    }
}

#[test]
fn nothing_names_the_placeholder_domain_as_the_home() {
    // Built from parts so that this file does not name it. A subdomain of it is another
    // placeholder (registry.example.invalid: the user's own registry) and stays.
    let placeholder = ["example", "invalid"].join(".");
    let mut files = Vec::new();
    tree_files(root(), &mut files);
    assert!(
        files.len() > 100,
        "the tree was walked: {} files",
        files.len()
    );
    let mut found = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not text
        };
        for (number, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices(&placeholder) {
                let before = line[..at].chars().next_back();
                if !before.is_some_and(|c| c == '.' || c == '-' || c.is_ascii_alphanumeric()) {
                    let file = file.strip_prefix(root()).unwrap_or(&file);
                    found.push(format!("{}:{}: {line}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the project's home is {}, not {placeholder}:\n{}",
        home(),
        found.join("\n")
    );
}

/// Every `pglease:X.Y.Z` in `text`: an image tag (ports, `pglease:5480`, have no dots).
fn image_tags(text: &str) -> Vec<String> {
    let mut tags = Vec::new();
    for (at, _) in text.match_indices("pglease:") {
        let tag: String = text[at + "pglease:".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .collect();
        if tag.starts_with(|c: char| c.is_ascii_digit()) && tag.matches('.').count() >= 2 {
            tags.push(tag);
        }
    }
    tags
}

#[test]
fn compose_and_kubernetes_run_the_versions_image() {
    let version = version();
    let compose = read("deploy/compose/docker-compose.yml");
    assert!(
        compose.contains(&format!("image: ${{PGLEASE_IMAGE:-pglease:{version}}}")),
        "compose's default image is pglease:{version}, the tag release/image.sh saves"
    );
    // deploy/test.sh builds that tag and runs compose with it.
    assert!(
        read("deploy/test.sh").contains("image=${PGLEASE_IMAGE:-pglease:$version}"),
        "deploy/test.sh builds pglease:<version> by default"
    );

    let mut pglease_images = 0;
    let dir = root().join("deploy/kubernetes");
    for entry in std::fs::read_dir(&dir).expect("deploy/kubernetes") {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a manifest");
        for line in text.lines() {
            let Some(image) = line.trim_start().strip_prefix("image:") else {
                continue;
            };
            let image = image.trim();
            let name = image.rsplit('/').next().unwrap_or(image);
            if name.starts_with("pglease:") {
                pglease_images += 1;
                assert_eq!(
                    name,
                    format!("pglease:{version}"),
                    "{}: {image}",
                    path.display()
                );
            }
        }
    }
    assert!(
        pglease_images >= 3,
        "the three manifests that run pglease name its image ({pglease_images} found)"
    );

    // And wherever the documentation names the image's tag.
    let mut documents = vec![root().join("README.md"), root().join("deploy/README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        documents.push(entry.expect("an entry").path());
    }
    for document in documents {
        let text = std::fs::read_to_string(&document).expect("a document");
        for tag in image_tags(&text) {
            assert_eq!(tag, version, "{}: pglease:{tag}", document.display());
        }
    }
}

#[test]
fn image_tags_are_told_from_ports() {
    assert_eq!(
        image_tags("http://pglease:5480 pglease:0.1.0 x/pglease:10.2.3-rc1, pglease:5432"),
        ["0.1.0", "10.2.3-rc1"]
    );
}

/// A directory under the system's temporary directory, outside the checkout (no go.mod or
/// go.work above it), removed when dropped.
struct OutsideDir(PathBuf);

impl Drop for OutsideDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn go(dir: &Path, proxy: &Path, cache: &Path, args: &[&str]) {
    let output = Command::new("go")
        .args(args)
        .current_dir(dir)
        .env("GOPROXY", format!("file://{}", proxy.display()))
        // The public checksum database knows no module that is not published.
        .env("GONOSUMDB", "github.com/pglease/pglease")
        .env("GOFLAGS", "-mod=mod -modcacherw")
        // A module cache of its own: the module comes from the proxy, not an earlier run.
        .env("GOMODCACHE", cache)
        .env("GOWORK", "off")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("run go");
    assert!(
        output.status.success(),
        "go {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn go_get_fetches_the_helper_from_the_release_proxy() {
    let test = "go_get_fetches_the_helper_from_the_release_proxy";
    if !tool_available("go", test, "install Go (https://go.dev/dl)") {
        return;
    }
    let outside =
        OutsideDir(std::env::temp_dir().join(format!("pglease-go-get-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&outside.0);
    let proxy = outside.0.join("goproxy");
    let made = Command::new("bash")
        .arg(root().join("release/go.sh"))
        .arg("--out")
        .arg(&proxy)
        .output()
        .expect("run release/go.sh");
    assert!(
        made.status.success(),
        "release/go.sh: {}",
        String::from_utf8_lossy(&made.stderr)
    );

    let user = outside.0.join("user");
    std::fs::create_dir_all(&user).expect("the user's module directory");
    std::fs::write(
        user.join("main.go"),
        "package main\n\n\
         import (\n\t\"fmt\"\n\n\tpglease \"github.com/pglease/pglease/clients/go\"\n)\n\n\
         func main() {\n\
         \tclient := pglease.NewClient(\"http://127.0.0.1:5480\", \"\")\n\
         \tfmt.Println(client != nil, pglease.Template(\"app\") != nil)\n}\n",
    )
    .expect("write main.go");
    let cache = outside.0.join("modcache");
    let module = "github.com/pglease/pglease/clients/go";
    go(&user, &proxy, &cache, &["mod", "init", "example.com/user"]);
    go(
        &user,
        &proxy,
        &cache,
        &["get", &format!("{module}@v{}", version())],
    );
    go(&user, &proxy, &cache, &["build", "-o", "user", "."]);
    let go_mod = std::fs::read_to_string(user.join("go.mod")).expect("go.mod");
    assert!(
        go_mod.contains(&format!("require {module} v{}", version())) && !go_mod.contains("replace"),
        "the module is required at the version, with no replace:\n{go_mod}"
    );
    let ran = Command::new(user.join("user")).output().expect("run it");
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "true true\n");
}
