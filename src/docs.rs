//! `pglease completions` and `pglease man`: what a package installs beside the binary,
//! generated from the command line's own definition (clap_complete, clap_mangen), so they
//! never disagree with `--help`.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManArgs};

/// Prints the completion script for `args.shell`.
pub fn completions(args: &CompletionsArgs) -> ExitCode {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "pglease", &mut out);
    write_out(&out)
}

/// Prints `pglease.1`, or writes it and a page per subcommand into `--out-dir`.
pub fn man(args: &ManArgs) -> ExitCode {
    let command = Cli::command();
    match &args.out_dir {
        Some(dir) => {
            let written =
                std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(command, dir));
            match written {
                Ok(()) => {
                    println!("{}", dir.display());
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!(
                        "pglease: cannot write the man pages into {}: {error}",
                        dir.display()
                    );
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            let mut out = Vec::new();
            match clap_mangen::Man::new(command).render(&mut out) {
                Ok(()) => write_out(&out),
                Err(error) => {
                    eprintln!("pglease: cannot render the man page: {error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Writes `bytes` to stdout; a closed pipe (`| head`) is no error worth a message.
fn write_out(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pglease: cannot write to stdout: {error}");
            ExitCode::FAILURE
        }
    }
}
