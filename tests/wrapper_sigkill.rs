//! If the wrapper itself is SIGKILLed, the adapter does not outlive it (parent-death signal set in
//! the adapter before exec).
mod common;
use common::*;

#[test]
fn adapter_dies_with_a_sigkilled_wrapper() {
    let tmp = TempDir::new("wrapkill");
    let state = tmp.join("state");
    let mut guard = Guard::new();
    let child = guard.child(
        leash(&state)
            .args([
                "exec",
                "--session",
                "k",
                "--",
                "sh",
                "-c",
                "trap '' TERM; while :; do sleep 1; done",
            ])
            .spawn()
            .unwrap(),
    );
    let wrapper = Pid::of(child.id() as i32).unwrap();
    let mut adapter = None;
    assert!(wait_for(|| {
        adapter = children(wrapper.pid).first().and_then(|&p| Pid::of(p));
        adapter.is_some()
    }));
    let adapter = adapter.unwrap();
    let mut adapter_guard = Guard::new();
    adapter_guard.add(adapter);
    signal(wrapper, libc::SIGKILL);
    child.wait().unwrap();
    assert!(
        wait_for(|| !adapter.alive()),
        "adapter outlived the SIGKILLed wrapper"
    );
}
