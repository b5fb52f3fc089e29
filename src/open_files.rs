//! The daemon's limit on open files, raised at start from the soft limit to the hard one (as
//! Go's runtime does for its programs): every HTTP connection takes a descriptor, and every
//! connection the PostgreSQL front relays takes two, so the usual soft limit of 1024 is
//! reached by a few hundred test connections, while the hard limit is the operator's to set.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises the soft limit to the hard one; logs the limit it runs with.
pub fn raise() {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::debug!(%error, "cannot read the open files limit");
            return;
        }
    };
    if soft >= hard {
        tracing::debug!(limit = soft, "open files limit");
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open files limit"),
        Err(error) => tracing::warn!(
            limit = soft,
            %error,
            "cannot raise the open files limit; connections beyond it are refused"
        ),
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        // Lowered first, so that the test shows a raise wherever it runs (other tests in
        // this process open few files).
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).expect("lower the soft limit");
        super::raise();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        assert_eq!(soft, hard);
    }
}
