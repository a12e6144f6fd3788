//! Per-session resource limits: parsed from the flags, checked against the controllers
//! available, written into the fresh lease cgroup.

use super::files::{write_file, CgroupError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Per-session resource limits (`leash exec --memory-max … --pids-max … --cpu-max …`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Bytes (`memory.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// `pids.max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// `cpu.max` as written: `"QUOTA PERIOD"` in microseconds, or `"max PERIOD"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_max: Option<String>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.memory_max.is_none() && self.pids_max.is_none() && self.cpu_max.is_none()
    }

    /// (controller, flag) for each limit that is set.
    pub fn needs(&self) -> Vec<(&'static str, &'static str)> {
        let mut v = Vec::new();
        if self.memory_max.is_some() {
            v.push(("memory", "memory-max"));
        }
        if self.pids_max.is_some() {
            v.push(("pids", "pids-max"));
        }
        if self.cpu_max.is_some() {
            v.push(("cpu", "cpu-max"));
        }
        v
    }

    /// Refuses the limits that the controllers available here cannot enforce.
    pub fn check(&self, available: &[String], root: &Path) -> Result<(), CgroupError> {
        for (controller, limit) in self.needs() {
            if !available.iter().any(|c| c == controller) {
                return Err(CgroupError::ControllerMissing {
                    controller,
                    limit,
                    root: root.to_path_buf(),
                });
            }
        }
        Ok(())
    }

    /// Writes the limits into the cgroup directory `dir` (its `memory.max`, `pids.max`,
    /// `cpu.max`). Called on the fresh lease cgroup before anything runs in it.
    pub fn apply(&self, dir: &Path) -> Result<(), CgroupError> {
        let put = |file: &'static str, v: String| {
            write_file(&dir.join(file), &v).map_err(|source| CgroupError::Io {
                what: "set a limit on",
                path: dir.join(file),
                source,
            })
        };
        if let Some(m) = self.memory_max {
            put("memory.max", m.to_string())?;
        }
        if let Some(p) = self.pids_max {
            put("pids.max", p.to_string())?;
        }
        if let Some(c) = &self.cpu_max {
            put("cpu.max", c.clone())?;
        }
        Ok(())
    }
}

/// Parses a size: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. `512M`; with a unit
/// the number may have a fraction (`1.5G` is 1536M; the bytes are rounded down).
pub fn parse_size(s: &str) -> Result<u64, CgroupError> {
    let bad = |why| CgroupError::BadLimit {
        flag: "--memory-max",
        value: s.to_string(),
        why,
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mul: u64 = match unit
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(bad("unknown unit (use K, M, G or T)")),
    };
    let too_large = || bad("too large (at most 16383T)");
    let v = if num.contains('.') {
        if mul == 1 {
            return Err(bad(
                "a fraction of a byte: give whole bytes, or a unit (e.g. 1.5G)",
            ));
        }
        let n: f64 = num
            .parse()
            .map_err(|_| bad("expected a size such as 512M, 1.5G or 2G"))?;
        let bytes = n * mul as f64;
        // 2^64 itself is not a u64; every f64 below it converts exactly (rounded down).
        if !bytes.is_finite() || bytes >= 18_446_744_073_709_551_616.0 {
            return Err(too_large());
        }
        bytes as u64
    } else {
        let n: u64 = num.parse().map_err(|e: std::num::ParseIntError| {
            if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) {
                too_large()
            } else {
                bad("expected a size such as 512M, 1.5G or 2G")
            }
        })?;
        n.checked_mul(mul).ok_or_else(too_large)?
    };
    if v == 0 {
        return Err(bad("must be more than 0"));
    }
    Ok(v)
}

/// The most CPUs `--cpu-max` takes (a quota of 4096 CPUs per 100 ms period).
const MAX_CPUS: f64 = 4096.0;

/// Parses `--cpu-max`: a number of CPUs (`0.5`, `2`), written as quota and a 100 ms period, or
/// the kernel's own form `QUOTA PERIOD` / `max PERIOD` in microseconds.
pub fn parse_cpu_max(s: &str) -> Result<String, CgroupError> {
    let bad = |why| CgroupError::BadLimit {
        flag: "--cpu-max",
        value: s.to_string(),
        why,
    };
    let t = s.trim();
    let parts: Vec<&str> = t.split_whitespace().collect();
    match parts.as_slice() {
        [cpus] => {
            let c: f64 = cpus
                .parse()
                .map_err(|_| bad("expected CPUs (e.g. 0.5) or 'QUOTA PERIOD' in microseconds"))?;
            if !(c.is_finite() && c > 0.0) {
                return Err(bad("CPUs must be more than 0"));
            }
            if c > MAX_CPUS {
                return Err(bad("at most 4096 CPUs"));
            }
            let quota = (c * 100_000.0).round().max(1_000.0) as u64;
            Ok(format!("{quota} 100000"))
        }
        [quota, period] => {
            let p: u64 = period
                .parse()
                .map_err(|_| bad("the period must be microseconds"))?;
            if !(1_000..=1_000_000).contains(&p) {
                return Err(bad("the period must be 1000..=1000000 microseconds"));
            }
            if *quota != "max" {
                let q: u64 = quota
                    .parse()
                    .map_err(|_| bad("the quota must be microseconds or max"))?;
                if q < 1_000 {
                    return Err(bad("the quota must be at least 1000 microseconds"));
                }
            }
            Ok(format!("{quota} {p}"))
        }
        _ => Err(bad("expected CPUs (e.g. 0.5) or 'QUOTA PERIOD'")),
    }
}

/// Tries to enable the controllers the limits need for the session cgroups: in the root's and
/// the gateway directory's `cgroup.subtree_control`. Failures are left for [`Limits::check`] to
/// report with the fix.
pub fn enable_controllers(root: &Path, gateway_root: &Path, limits: &Limits) {
    for (controller, _) in limits.needs() {
        for dir in [root, gateway_root] {
            let _ = write_file(
                &dir.join("cgroup.subtree_control"),
                &format!("+{controller}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn sizes_and_cpu_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        for bad in ["", "0", "-1", "12Q", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpu_max("0.5").unwrap(), "50000 100000");
        assert_eq!(parse_cpu_max("max 100000").unwrap(), "max 100000");
        assert_eq!(parse_cpu_max("20000 100000").unwrap(), "20000 100000");
        for bad in [
            "0",
            "-1",
            "nan",
            "x 100000",
            "100 100000",
            "1 2 3",
            "50000 10",
        ] {
            assert!(parse_cpu_max(bad).is_err(), "{bad}");
        }
    }

    /// Decimal sizes with a unit are sizes, and each refusal says what is wrong with the value:
    /// `1.5G` once said "unknown unit", `--cpu-max 1000000000000` "CPUs must be more than 0".
    #[test]
    fn decimal_sizes_parse_and_refusals_name_the_real_problem() {
        assert_eq!(parse_size("1.5G").unwrap(), 1536 << 20);
        assert_eq!(parse_size("0.5M").unwrap(), 512 << 10);
        assert_eq!(parse_size("2.25GiB").unwrap(), (9 << 30) / 4);
        assert_eq!(parse_size("1.0001K").unwrap(), 1024);
        let why = |s: &str| parse_size(s).unwrap_err().to_string();
        assert!(why("1.5").contains("fraction of a byte"), "{}", why("1.5"));
        assert!(why("99999999999999T").contains("too large"));
        assert!(why("99999999999999999999999").contains("too large"));
        assert!(why("99999999.5T").contains("too large"));
        assert!(why("1.2.3G").contains("expected a size"));
        assert!(why("12Q").contains("unknown unit"));
        let cpu = |s: &str| parse_cpu_max(s).unwrap_err().to_string();
        assert!(
            cpu("1000000000000").contains("at most 4096 CPUs"),
            "{}",
            cpu("1000000000000")
        );
        assert!(cpu("0").contains("more than 0"));
        assert_eq!(parse_cpu_max("4096").unwrap(), "409600000 100000");
    }

    #[test]
    fn limits_write_memory_max_into_a_cgroup_directory() {
        // A fake cgroup directory: on this host the v2 hierarchy has no memory controller, so
        // the write path is exercised against plain files with the kernel's names.
        let dir = std::env::temp_dir().join(format!("leash-fake-cg-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).unwrap();
        for f in ["memory.max", "pids.max", "cpu.max"] {
            fs::write(dir.join(f), "max\n").unwrap();
        }
        let limits = Limits {
            memory_max: Some(parse_size("256M").unwrap()),
            pids_max: Some(64),
            cpu_max: Some(parse_cpu_max("1.5").unwrap()),
        };
        limits.apply(&dir).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            "268435456"
        );
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "64");
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "150000 100000"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_controller_is_refused_with_the_fix() {
        let limits = Limits {
            memory_max: Some(1 << 20),
            ..Limits::default()
        };
        let err = limits
            .check(&["cpu".into()], Path::new("/sys/fs/cgroup/x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory controller"), "{err}");
        assert!(err.contains("Delegate=yes"), "{err}");
        assert!(limits.check(&["memory".into()], Path::new("/x")).is_ok());
    }
}
