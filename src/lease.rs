//! What a lease needs from the host, not from its arguments: a fresh id and the clock. The lease
//! itself is plain data in `leash_core::model`.

/// A new lease id: UUID v7, so ids sort by creation time.
pub fn new_lease_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_v7_and_sortable() {
        let a = new_lease_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_lease_id();
        assert!(a < b);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 7);
    }
}
