//! The fleet's share of the redelivery: every host watches the same hook, and one of them asks
//! GitHub for each failed delivery.

use super::{Ledger, LedgerError};

impl Ledger {
    /// Of `guids`, the ones no host has asked GitHub to redeliver yet, now taken by this host
    /// (in one statement: two hosts' passes cannot both take a guid).
    pub async fn take_redeliveries(&self, guids: &[String]) -> Result<Vec<String>, LedgerError> {
        let result = async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "INSERT INTO ephemer_redeliveries (guid, host)
                     SELECT g, $2 FROM unnest($1::text[]) AS g
                     ON CONFLICT (guid) DO NOTHING RETURNING guid",
                    &[&guids, &self.host()],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        }
        .await;
        self.track(result)
    }

    /// Gives a taken guid back (GitHub refused the ask; a later pass, on any host, tries again).
    pub async fn give_back_redelivery(&self, guid: &str) -> Result<(), LedgerError> {
        let result = async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM ephemer_redeliveries WHERE guid = $1 AND host = $2",
                    &[&guid, &self.host()],
                )
                .await?;
            Ok(())
        }
        .await;
        self.track(result)
    }
}
