//! How a scenario ended (`Outcome`: its figures, a harness failure, or not run) and the
//! line the tables print for one that produced no figures. The report holds one per
//! scenario and the scenarios print their own tables from them, so it sits below both.

use serde::Serialize;

/// How a scenario ended.
#[derive(Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome<T> {
    /// Ran; here are its figures.
    Done(T),
    /// The harness failed (not a figure): the error.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Not run.
    Skipped {
        /// Why.
        reason: String,
    },
}

impl<T> Outcome<T> {
    /// The figures, if the scenario ran.
    pub fn done(&self) -> Option<&T> {
        match self {
            Outcome::Done(value) => Some(value),
            _ => None,
        }
    }

    /// A skipped scenario.
    pub fn skipped(reason: impl Into<String>) -> Self {
        Outcome::Skipped {
            reason: reason.into(),
        }
    }
}

/// A line for a scenario that did not produce figures.
pub(crate) fn not_done<T>(outcome: &Outcome<T>, out: &mut String) -> bool {
    match outcome {
        Outcome::Done(_) => false,
        Outcome::Failed { error } => {
            out.push_str(&format!("  FAILED (harness): {error}\n"));
            true
        }
        Outcome::Skipped { reason } => {
            out.push_str(&format!("  not run: {reason}\n"));
            true
        }
    }
}
