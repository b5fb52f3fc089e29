//! The numbers leases carry, per template: an IntegreSQL test id names a database for its
//! client, who gives it back by that id (unlock, recreate), so an id handed out must never
//! name another database while a client could still hold it. A lease of the native API gets
//! a number from the same counter, so the two never meet.
//!
//! An id is either *fresh* (never handed out), *held* (carried by a database record, see
//! `Db::test_id`), *vacant* (its client gave it back and no database carries it: it may be
//! handed out again, smallest first, as IntegreSQL reuses the slot of a recreated
//! database), or *retired* (its database left the pool while its client could still hold
//! it: expired, reclaimed, lost with its server; it is never handed out again). Only the
//! fresh boundary and the vacant ones are stored; held ids live on the records.
//!
//! The counters outlive their template entries (a reset, a lost server, a failed
//! initialization forget a client-built template, not the ids its clients may hold): one
//! small entry per template name seen since the daemon started. This file decides nothing
//! about when an id is given back; `dbs.rs` and the rules call [`TestIds::vacate`].

use std::collections::{BTreeMap, BTreeSet};

use crate::names::TemplateName;

/// Every template's numbers.
#[derive(Debug, Default)]
pub(super) struct TestIds {
    templates: BTreeMap<TemplateName, Numbers>,
}

/// One template's numbers.
#[derive(Debug, Default)]
struct Numbers {
    /// The first number never handed out.
    next: u32,
    /// Ids given back that no database carries.
    vacant: BTreeSet<u32>,
}

impl TestIds {
    /// A number no lease of `template` ever had (a native lease's).
    pub fn fresh(&mut self, template: &TemplateName) -> u32 {
        let numbers = self.templates.entry(template.clone()).or_default();
        let number = numbers.next;
        // Four billion leases of one template in one run are not a case to design for.
        numbers.next = numbers.next.wrapping_add(1);
        number
    }

    /// An id for an IntegreSQL getter given a database that carries none: the smallest
    /// vacant one, else a fresh one.
    pub fn take(&mut self, template: &TemplateName) -> u32 {
        let vacant = self
            .templates
            .get_mut(template)
            .and_then(|numbers| numbers.vacant.pop_first());
        vacant.unwrap_or_else(|| self.fresh(template))
    }

    /// `id` of `template` was given back and no database carries it any more.
    pub fn vacate(&mut self, template: &TemplateName, id: u32) {
        let numbers = self.templates.entry(template.clone()).or_default();
        debug_assert!(id < numbers.next, "id {id} of {template} was never issued");
        numbers.vacant.insert(id);
    }

    /// Whether `id` of `template` was handed out at some point.
    pub fn issued(&self, template: &TemplateName, id: u32) -> bool {
        self.templates
            .get(template)
            .is_some_and(|numbers| id < numbers.next)
    }

    /// Whether `id` of `template` is vacant.
    pub fn is_vacant(&self, template: &TemplateName, id: u32) -> bool {
        self.templates
            .get(template)
            .is_some_and(|numbers| numbers.vacant.contains(&id))
    }

    /// Every vacant id, with its template.
    pub fn vacant(&self) -> impl Iterator<Item = (&TemplateName, u32)> {
        self.templates
            .iter()
            .flat_map(|(name, numbers)| numbers.vacant.iter().map(move |id| (name, *id)))
    }
}
