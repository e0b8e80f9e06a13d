//! hookledger's own tables, and what a handler's statement may do to them: read them, add rows
//! to the outbox (queueing a call, once per key), nothing else. A claim deleted from the
//! ledger makes a resent event new again (applied twice), a dropped ledger forgets every
//! event, and an outbox row changed or replaced delivers what hookledger never queued (or
//! drops what it did). The built-in handlers keep to this too: they write their own tables
//! and add outbox rows.
//!
//! Both stores refuse an `[[effect]]` statement that breaks the rule at start-up, naming the
//! effect; on SQLite the authorizer also denies it to every handler at run time.

/// How a statement changes a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Adds rows (and, on a conflict, does nothing).
    Insert,
    /// Changes rows, an upsert's `DO UPDATE` and `MERGE` included.
    Update,
    /// Deletes rows, an `INSERT OR REPLACE`'s replaced rows included.
    Delete,
    /// Creates, alters or drops the table, or an index, trigger or view on it.
    Schema,
}

/// Why a handler's statement may not make `change` to `table` (any schema, any case); `None`
/// when it may. Names only hookledger's own tables.
pub(crate) fn refused(table: &str, change: Change) -> Option<String> {
    let name = table.to_ascii_lowercase();
    if name == "outbox" {
        return (change != Change::Insert).then(|| {
            "an effect may only add rows to `outbox` (INSERT, ON CONFLICT DO NOTHING at most): \
             changing, replacing or deleting its rows, or its schema, would deliver what \
             hookledger never queued or drop what it did"
                .to_string()
        });
    }
    if name == "webhook_events" {
        return Some(
            "`webhook_events` is the ledger: an effect may read it, never change it (a deleted \
             claim makes a resent event new again)"
                .to_string(),
        );
    }
    if name.starts_with("hookledger_") || name == "alert_incidents" {
        return Some(format!(
            "`{name}` is hookledger's own table: an effect may read it, never change it"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_and_hookledgers_tables_are_read_only_and_the_outbox_takes_inserts() {
        for change in [
            Change::Insert,
            Change::Update,
            Change::Delete,
            Change::Schema,
        ] {
            assert!(refused("webhook_events", change).is_some());
            assert!(refused("WEBHOOK_EVENTS", change).is_some());
            assert!(refused("hookledger_heartbeat", change).is_some());
            assert!(refused("hookledger_app_migrations", change).is_some());
            assert!(refused("alert_incidents", change).is_some());
            assert!(refused("orders", change).is_none());
            assert!(
                refused("subscriptions", change).is_none(),
                "stripe-billing's"
            );
        }
        assert!(refused("outbox", Change::Insert).is_none());
        for change in [Change::Update, Change::Delete, Change::Schema] {
            assert!(refused("Outbox", change).is_some());
        }
    }
}
