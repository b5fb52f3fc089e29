//! The pool's promises, stated as code: [`PoolState::check_invariants`] runs after every
//! event in tests and debug builds (the actor calls it), and the interleaving test calls
//! it after every step of its generated sequences.

use std::collections::HashSet;

use super::dbs::Phase;
use super::{PoolState, Server, WaiterId};

impl PoolState {
    /// Checks every promise the records must keep; the first broken one is described.
    /// It reads as the list of the state's promises, one family per step, checked in this
    /// order.
    // A message by design: a broken promise is a bug, and its words go to a test's panic
    // or a debug build's log; nothing decides by its kind.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.template_databases_are_not_records()?;
        self.records_belong_to_templates()?;
        self.test_ids_name_one_database_each()?;
        let granted = self.no_database_leased_twice()?;
        self.no_request_waits_twice(granted)?;
        self.nothing_outlives_the_server()?;
        self.budgets_are_respected()
    }

    /// A template's own databases are not records, and no two templates share one.
    fn template_databases_are_not_records(&self) -> Result<(), String> {
        let mut held = HashSet::new();
        for (name, entry) in &self.templates {
            for db in entry.template_dbs() {
                if !held.insert(db.clone()) {
                    return Err(format!("template database {db} is held twice ({name})"));
                }
                if let Some(record) = self.dbs.get(db) {
                    return Err(format!(
                        "template database {db} of {name} is also a record ({:?})",
                        record.phase
                    ));
                }
            }
        }
        Ok(())
    }

    /// A clone being made outlives a template forgotten meanwhile (its job drops it when it
    /// reports); anything else must belong to a template.
    fn records_belong_to_templates(&self) -> Result<(), String> {
        for (name, db) in self.dbs.iter() {
            let may_be_orphan = matches!(db.phase, Phase::Dropping(_) | Phase::Making { .. });
            if !may_be_orphan && !self.templates.contains_key(&db.template) {
                return Err(format!(
                    "{name} ({:?}) belongs to no template ({})",
                    db.phase, db.template
                ));
            }
        }
        Ok(())
    }

    /// An IntegreSQL test id names one database of its template at a time; carried ids
    /// were handed out, and are not free to be handed out again; a vacant id was handed out
    /// once (so it is not fresh as well).
    fn test_ids_name_one_database_each(&self) -> Result<(), String> {
        let mut test_ids = HashSet::new();
        for (name, db) in self.dbs.iter() {
            let Some(test_id) = db.test_id else {
                continue;
            };
            if matches!(db.phase, Phase::Dropping(_)) {
                continue;
            }
            let template = &db.template;
            if !test_ids.insert((template.clone(), test_id)) {
                return Err(format!(
                    "test id {test_id} of {template} names two databases ({name} is one)"
                ));
            }
            if !self.dbs.test_ids.issued(template, test_id) {
                return Err(format!(
                    "{name} carries test id {test_id} of {template}, never handed out"
                ));
            }
            if self.dbs.test_ids.is_vacant(template, test_id) {
                return Err(format!(
                    "{name} carries test id {test_id} of {template}, which is vacant"
                ));
            }
        }
        for (template, id) in self.dbs.test_ids.vacant() {
            if !self.dbs.test_ids.issued(template, id) {
                return Err(format!(
                    "test id {id} of {template} is vacant but never issued"
                ));
            }
        }
        Ok(())
    }

    /// No grant of an old version, and no database leased twice: the ready queue holds the
    /// current version only, one record per database, one id per lease or kept database.
    /// Returns the requests whose grant a lease holds back (its connection limit being set).
    fn no_database_leased_twice(&self) -> Result<HashSet<WaiterId>, String> {
        let mut lease_ids = HashSet::new();
        let mut granted = HashSet::new();
        for (name, db) in self.dbs.iter() {
            match &db.phase {
                Phase::Ready { .. } => {
                    let template = self.templates.get(&db.template);
                    let current = template.and_then(|e| e.current()).map(|v| &v.db);
                    if current.is_none() || current != db.made_from.as_ref() {
                        return Err(format!(
                            "ready clone {name} was made from {:?}, not the current version {current:?}",
                            db.made_from
                        ));
                    }
                }
                Phase::Leased(record) => {
                    if !lease_ids.insert(record.id.clone()) {
                        return Err(format!("lease {} holds two databases", record.id));
                    }
                    // An IntegreSQL client finds its database by the id it was given; a
                    // native lease took its database's id away.
                    let expected = record.reclaimable.then_some(record.number);
                    if db.test_id != expected {
                        return Err(format!(
                            "{name} was given out as {expected:?} but carries test id {:?}",
                            db.test_id
                        ));
                    }
                    if let Some(waiter) = record.pending.as_ref().map(|w| w.id) {
                        if !granted.insert(waiter) {
                            return Err(format!("request {waiter} was granted twice"));
                        }
                    }
                }
                // A kept database keeps its lease's id: no lease or other kept one has it.
                Phase::Kept(record) => {
                    if !lease_ids.insert(record.id.clone()) {
                        return Err(format!("id {} names two databases (kept)", record.id));
                    }
                    if record.until < record.kept_at {
                        return Err(format!("{name} is kept until before it was kept"));
                    }
                }
                Phase::Making { .. } | Phase::Adoptable { .. } | Phase::Dropping(_) => {}
            }
        }
        Ok(granted)
    }

    /// A request waits once, and not once it was granted (`granted`: the grants held back).
    fn no_request_waits_twice(&self, mut granted: HashSet<WaiterId>) -> Result<(), String> {
        for entry in self.templates.values() {
            for waiter in &entry.waiters {
                if !granted.insert(waiter.id) {
                    return Err(format!(
                        "request {} waits twice (or was granted)",
                        waiter.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// No database record outlives its server, save while it stops.
    fn nothing_outlives_the_server(&self) -> Result<(), String> {
        if self.server != Server::Up && self.server != Server::Stopping {
            if let Some((name, db)) = self.dbs.iter().next() {
                return Err(format!("{name} ({:?}) outlived its server", db.phase));
            }
        }
        Ok(())
    }

    /// The budgets hold: connections, concurrent drops, bytes, clones per template.
    fn budgets_are_respected(&self) -> Result<(), String> {
        let in_use = self.connections_in_use();
        if in_use > self.connection_budget {
            return Err(format!(
                "leases and open client templates hold {in_use} connections, over the budget of {}",
                self.connection_budget
            ));
        }
        let drops = self.dbs.drops_running();
        if drops > self.limits.clone_concurrency.max(1) {
            return Err(format!("{drops} drops run at once"));
        }
        let clone_bytes: u64 = self
            .dbs
            .iter()
            .filter(|(_, db)| {
                matches!(
                    db.phase,
                    Phase::Making { .. } | Phase::Ready { .. } | Phase::Leased(_) | Phase::Kept(_)
                )
            })
            .map(|(_, db)| db.bytes)
            .sum();
        // On a store whose clones share blocks the budget is the store's measured usage,
        // which tests' writes can push past it; clones' logical sizes do not count.
        if let Some(budget) = self
            .limits
            .max_bytes
            .filter(|_| self.store_used().is_none())
        {
            if clone_bytes > budget {
                return Err(format!(
                    "clones hold {clone_bytes} bytes, over the budget of {budget}"
                ));
            }
        }
        for (name, counts) in self.dbs.all_counts() {
            if counts.total() > self.limits.max_total {
                return Err(format!(
                    "{name} has {} clones, over max_total {} ({counts:?})",
                    counts.total(),
                    self.limits.max_total
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
impl PoolState {
    /// Every database the pool still uses: its records not on their way out, and the
    /// templates' own databases.
    pub(super) fn live_databases(&self) -> std::collections::BTreeSet<crate::names::DbName> {
        let records = self
            .dbs
            .iter()
            .filter(|(_, db)| !matches!(db.phase, Phase::Dropping(_)))
            .map(|(name, _)| name.clone());
        let templates = self
            .templates
            .values()
            .flat_map(|e| e.template_dbs().into_iter().cloned());
        records.chain(templates).collect()
    }
}
