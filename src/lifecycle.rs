//! The lifecycle verbs' old address: the controller and its typed outcomes now live in
//! [`crate::controller`] (one file per verb); these names stay so callers and the tests that
//! import `leash::lifecycle::…` keep working.

pub use crate::controller::{
    CancelOutcome, CloseOutcome, CloseResult, Controller, LeaseRef, LegacyOutcome, LifecycleError,
    ReapReport, RefusedSignal, SignalRecord, SweptCgroup,
};
