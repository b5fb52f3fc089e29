//! Which server holds a lease, read from its id. Each pool mints its lease ids with its
//! server's byte first ([`LeaseId::random`]): 00 for the primary, a further server's major
//! for its (`10…` for PostgreSQL 16, `12…` for 18). So an id names its server: a release,
//! renew, keep or drop goes to that one pool, with the very id it minted (and logs). Ids
//! stay 32 lowercase hex characters, as the API documents, and clients need not know any
//! of this.
//!
//! An id whose first byte is no running further server's goes to the primary, which
//! answers for an unknown id as it always did (404, or 410 for a lease lost with its
//! server); the IntegreSQL API speaks only to the primary.

use crate::names::LeaseId;

/// The primary's byte.
pub(super) const PRIMARY: u8 = 0;

/// A further server's byte: its major, which is never zero (None for a major that does
/// not fit a byte, which no PostgreSQL has).
pub(super) fn stamp_of(major: u32) -> Option<u8> {
    u8::try_from(major).ok().filter(|&stamp| stamp != PRIMARY)
}

/// The byte of the server that holds the lease `id`.
pub(super) fn stamp(id: &LeaseId) -> u8 {
    id.first_byte()
}
