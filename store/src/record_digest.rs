//! The digest a catalog record (a version's commit record, a view's record) carries of its own
//! fields.

/// The `blake3:<hex>` digest of a catalog record (as JSON) without its `digest` field: its
/// compact JSON with every object's keys sorted, so that the record read back from its file
/// gives the digest the committed one did.
pub(crate) fn record_digest(record: &serde_json::Value) -> String {
    fn sorted(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                serde_json::Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
            }
            serde_json::Value::Array(items) => serde_json::Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    // (Left out before the keys are sorted: a map that keeps its order fills a removed key's
    // place with its last key.)
    let mut record = record.clone();
    if let Some(map) = record.as_object_mut() {
        map.remove("digest");
    }
    let json = serde_json::to_vec(&sorted(&record)).expect("JSON values serialise");
    format!("blake3:{}", blake3::hash(&json).to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's digest is the same read back from its file (a digest field in the middle of
    /// its keys, keys in any order) and differs once a field does.
    #[test]
    fn a_records_digest_is_the_same_read_back_and_changes_with_a_field() {
        let written = serde_json::json!({"name": "a", "version": 1, "counts": {"steps": 300, "episodes": 5}, "fps": 30.5});
        let digest = record_digest(&written);
        let read: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"counts": {{"episodes": 5, "steps": 300}}, "digest": "{digest}", "name": "a", "fps": 30.5, "version": 1}}"#
        ))
        .expect("json");
        assert_eq!(record_digest(&read), digest);
        let mut changed = read;
        changed["counts"]["steps"] = serde_json::json!(299);
        assert_ne!(record_digest(&changed), digest);
    }
}
