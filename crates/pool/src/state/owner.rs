//! Whose a template pglease builds is, and who may change it: the operator's (defined by
//! `--template` or the configuration file) or the API's (registered with
//! `PUT /templates/{name}`). The fact lives once, in the template's entry
//! (`Configured::owner`); the API only says who asks ([`Changer`]), never whose a template
//! is. It does not authenticate anyone: that is the API's token check.

/// Who asks to change a template (give it a source, or build a new version now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changer {
    /// The daemon's own configuration, at start.
    Configuration,
    /// An API caller who showed the API's token (`--token`, `--token-file`): the operator
    /// handed it the token, so it may change what the operator defined.
    TokenHolder,
    /// An API caller where no token guards the route: anybody who can reach the port,
    /// whom the API cannot tell apart from anybody else.
    Anyone,
}

/// Whose a template pglease builds is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// Defined by the operator (`--template`, the configuration file): only the
    /// configuration and a token holder may change it.
    Operator,
    /// Registered over the API: any caller may change it.
    Api,
}

impl Owner {
    /// The owner of a template `changer` creates.
    pub fn of_new(changer: Changer) -> Self {
        match changer {
            Changer::Configuration => Owner::Operator,
            Changer::TokenHolder | Changer::Anyone => Owner::Api,
        }
    }

    /// Whether `changer` may change a template of this owner.
    pub fn lets(self, changer: Changer) -> bool {
        match (self, changer) {
            (Owner::Api, _) => true,
            (Owner::Operator, Changer::Configuration | Changer::TokenHolder) => true,
            (Owner::Operator, Changer::Anyone) => false,
        }
    }
}
