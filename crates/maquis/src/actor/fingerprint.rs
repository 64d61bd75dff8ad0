//! Message type fingerprints: a number that names a message type's shape, so that a node
//! refuses a remote message of another type than its actor takes instead of decoding it as
//! the wrong message.
//!
//! The fingerprint of `M` is a hash of the serde data model of `M` — the names and order of its
//! structs, enums, fields and variants and the types of their contents, followed through every
//! type it holds — as `serde-reflection` traces it from `M`'s `Deserialize`. It travels with
//! every remote send and reply; the receiver compares it with its actor's before decoding.
//!
//! What follows from that:
//!
//! - Two nodes built from the same definition of a type agree, whatever crate or module path
//!   it sits in; the fingerprint does not depend on the compiler or the build.
//! - Any change that changes the encoding (a field or variant added, removed, reordered or
//!   retyped) changes the fingerprint; so does renaming a type, a field or a variant, which
//!   postcard alone would not notice. Messages are not self-describing: no change of a message
//!   type is compatible across nodes, and the fingerprint turns such a mix into a counted,
//!   logged refusal instead of a wrong message. `#[serde(rename)]` keeps a wire name while the
//!   Rust name changes.
//! - A type whose `Deserialize` refuses the values the tracer makes up (one that validates its
//!   input: `NonZeroU32`, a type with a custom check) cannot be traced: its fingerprint is `0`,
//!   which means "unchecked", and such messages are decoded as before (logged once at debug).
//!
//! Fingerprints are computed once per type and process and kept in a table that holds one entry
//! per message type the program uses (bounded by the program, not by its input).

use std::any::{type_name, TypeId};
use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use serde::de::DeserializeOwned;
use serde_reflection::{ContainerFormat, Tracer, TracerConfig};
use sha2::{Digest, Sha256};

/// "No fingerprint": the type could not be traced; nothing is checked against it.
pub(crate) const UNCHECKED: u64 = 0;

/// The most tracing passes spent on one type (enums nested in enums need several).
const MAX_PASSES: usize = 64;

/// Fingerprints a thread remembers without taking the table's lock (the message types it
/// sent last, most recent first).
const RECENT: usize = 8;

thread_local! {
    static RECENT_TYPES: std::cell::RefCell<Vec<(TypeId, u64)>> =
        std::cell::RefCell::new(Vec::with_capacity(RECENT));
}

/// The fingerprint of `M` (computed on first use, then read from a table; a thread's last few
/// types without the table's lock, since every send asks).
pub(crate) fn fingerprint<M: DeserializeOwned + 'static>() -> u64 {
    let id = TypeId::of::<M>();
    let recent = RECENT_TYPES.with(|r| {
        let r = r.try_borrow().ok()?;
        r.iter().find(|(t, _)| *t == id).map(|&(_, f)| f)
    });
    if let Some(f) = recent {
        return f;
    }
    let f = shared::<M>(id);
    RECENT_TYPES.with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            if r.len() == RECENT {
                r.pop();
            }
            r.insert(0, (id, f));
        }
    });
    f
}

/// The fingerprint of `M`, whose `TypeId` is `id`, from the table all threads share.
fn shared<M: DeserializeOwned + 'static>(id: TypeId) -> u64 {
    static TABLE: OnceLock<RwLock<HashMap<TypeId, u64>>> = OnceLock::new();
    let table = TABLE.get_or_init(Default::default);
    if let Some(f) = table.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return *f;
    }
    // Computed without the lock held: tracing deserializes `M`, which may need the fingerprint
    // of another type. Two threads may both compute it; they get the same number.
    let f = compute::<M>();
    table
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, f);
    f
}

/// Whether a message of fingerprint `sent` may be decoded as a type of fingerprint `expected`.
pub(crate) fn compatible(sent: u64, expected: u64) -> bool {
    sent == expected || sent == UNCHECKED || expected == UNCHECKED
}

fn compute<M: DeserializeOwned>() -> u64 {
    match shape::<M>() {
        Ok(bytes) => {
            let digest = Sha256::digest(&bytes);
            let mut f = [0u8; 8];
            f.copy_from_slice(&digest[..8]);
            // 0 is reserved for "unchecked".
            u64::from_le_bytes(f).max(1)
        }
        Err(e) => {
            tracing::debug!(
                message_type = type_name::<M>(),
                error = %e,
                "message type cannot be traced; remote messages of it are not type-checked"
            );
            UNCHECKED
        }
    }
}

/// The traced data model of `M`, encoded: its own format and the registry of every named
/// container it reaches.
///
/// The tracer explores the variants of the top type's enum by itself, but an enum met inside
/// it only once it is told to look again: each attempt runs twice as many passes as the one
/// before, and between passes lets the tracer look again at every enum the previous attempt
/// found, until two attempts agree. The passes are deterministic, so every node gets the same
/// result.
fn shape<M: DeserializeOwned>() -> Result<Vec<u8>, serde_reflection::Error> {
    let mut enums: Vec<String> = Vec::new();
    let mut last: Option<Vec<u8>> = None;
    let mut passes = 1;
    while passes <= MAX_PASSES {
        let mut tracer = Tracer::new(TracerConfig::default());
        let mut format = None;
        for _ in 0..passes {
            format = Some(tracer.trace_simple_type::<M>()?.0);
            for name in &enums {
                tracer.check_incomplete_enum(name);
            }
        }
        let registry = tracer.registry_unchecked();
        enums = registry
            .iter()
            .filter(|(_, c)| matches!(c, ContainerFormat::Enum(_)))
            .map(|(name, _)| name.clone())
            .collect();
        let bytes = postcard::to_allocvec(&(format, &registry))
            .map_err(|e| serde_reflection::Error::Custom(e.to_string()))?;
        if last.as_ref() == Some(&bytes) {
            return Ok(bytes);
        }
        last = Some(bytes);
        passes *= 2;
    }
    Err(serde_reflection::Error::Custom(format!(
        "the enums it holds were not all traced in {MAX_PASSES} passes"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    mod bank {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub(super) enum Account {
            Deposit { cents: u64 },
            Withdraw { cents: u64 },
        }
    }

    mod other {
        use super::*;
        // The same definition in another module: the same type on the wire.
        #[derive(Serialize, Deserialize)]
        pub(super) enum Account {
            Deposit { cents: u64 },
            Withdraw { cents: u64 },
        }
        // Same shape, other variant names.
        #[derive(Serialize, Deserialize)]
        pub(super) enum Ledger {
            Credit { cents: u64 },
            Debit { cents: u64 },
        }
    }

    #[derive(Serialize, Deserialize)]
    enum Outer {
        A(Inner),
        B { inner: Inner, more: Vec<Inner> },
    }

    #[derive(Serialize, Deserialize)]
    enum Inner {
        X,
        Y(u8),
        Z { s: String },
    }

    // As `Outer` on the wire but for one field of the last variant of the enum inside.
    #[derive(Serialize, Deserialize)]
    #[serde(rename = "Outer")]
    enum OuterChanged {
        A(InnerChanged),
        B {
            inner: InnerChanged,
            more: Vec<InnerChanged>,
        },
    }

    #[derive(Serialize, Deserialize)]
    #[serde(rename = "Inner")]
    enum InnerChanged {
        X,
        Y(u8),
        Z { s: String, n: u32 },
    }

    #[test]
    fn same_definition_same_fingerprint_other_names_or_shapes_differ() {
        let account = fingerprint::<bank::Account>();
        assert_ne!(account, UNCHECKED);
        assert_eq!(account, fingerprint::<other::Account>());
        assert_ne!(account, fingerprint::<other::Ledger>());
        assert_ne!(account, fingerprint::<u64>());
        assert_ne!(fingerprint::<Vec<u8>>(), fingerprint::<String>());
        assert_eq!(account, fingerprint::<bank::Account>(), "stable");
    }

    #[test]
    fn a_change_deep_inside_nested_enums_shows() {
        let outer = fingerprint::<Outer>();
        assert_ne!(outer, UNCHECKED, "nested enums are traced");
        assert_ne!(outer, fingerprint::<OuterChanged>());
        // The same type under the same wire names: the same fingerprint.
        #[derive(Serialize, Deserialize)]
        #[serde(rename = "Outer")]
        enum OuterSame {
            A(InnerSame),
            B {
                inner: InnerSame,
                more: Vec<InnerSame>,
            },
        }
        #[derive(Serialize, Deserialize)]
        #[serde(rename = "Inner")]
        enum InnerSame {
            X,
            Y(u8),
            Z { s: String },
        }
        assert_eq!(outer, fingerprint::<OuterSame>());
    }

    #[test]
    fn a_type_that_validates_its_input_is_unchecked() {
        assert_eq!(fingerprint::<std::num::NonZeroU32>(), UNCHECKED);
        assert!(compatible(UNCHECKED, fingerprint::<u64>()));
        assert!(compatible(fingerprint::<u64>(), UNCHECKED));
        assert!(!compatible(fingerprint::<u64>(), fingerprint::<u32>()));
    }
}
