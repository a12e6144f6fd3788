//! Containment: one cgroup v2 directory per lease, so that no process a lease started can leave
//! it. A process cannot move itself out of its cgroup without write access to the hierarchy, and
//! `cgroup.kill` takes every member at once, whoever its parent is and whatever its environment
//! says; that closes the one gap pids, groups and markers leave (a double-forked, `setsid`,
//! `env -i`, TERM-ignoring descendant of a SIGKILLed wrapper).
//!
//! Layout: `<leash cgroup root>/<gateway id>/<lease id>`. The leash cgroup root comes from
//! `--cgroup-root` / `LEASH_CGROUP_ROOT`, else from the caller's own cgroup (`/proc/self/cgroup`,
//! a delegated subtree under systemd `Delegate=yes`; the daemon's own leaf [`DAEMON_LEAF`] is
//! stripped so the daemon and the `leash exec` it spawns agree); a caller in the root cgroup uses
//! `<mount>/leash`. The cgroup2 mount is found in `/proc/self/mountinfo` (hybrid hosts mount it
//! at `/sys/fs/cgroup/unified`).
//!
//! This module is the only place in the library that writes to cgroupfs. Every write that acts
//! on a lease's cgroup goes through a [`Verified`] handle: the directory opened without following
//! symlinks, and its inode (the cgroup id) compared with the one recorded in the lease. Files in
//! it are then reached through `/proc/self/fd/<fd>/…`, so a directory removed and recreated under
//! the same name after the check is never the one written to.
//!
//! The module is split by concern: [`root`] resolves where leash's cgroups live (the cgroup2
//! mount, the leash root, the daemon's leaf), [`lifecycle`] makes and removes a lease's cgroup
//! (and holds the [`Verified`] handle), [`observe`] reads a cgroup's members, `populated` and
//! usage, and [`limits`] parses and applies the per-session limits. What they share is in the
//! low file `files` (the error, opening a cgroup directory, a file in it, writing one).

mod files;
mod lifecycle;
mod limits;
mod observe;
mod root;

pub use files::CgroupError;

pub use lifecycle::{
    create_lease_cgroup, hold_gateway_dir, release_gateway_dir, remove_gateway_dir_if_empty,
    Verified,
};
pub use limits::{enable_controllers, parse_cpu_max, parse_size, Limits};
pub use observe::{children, observe, Usage};
pub use root::{
    cgroup2_mount, default_root, describe, move_self_to_leaf, own_cgroup, Containment, Requested,
    Settings, DAEMON_LEAF, ENV_CGROUP_ROOT, ENV_CONTAINMENT,
};
