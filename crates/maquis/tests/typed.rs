//! A remote message of another type than its actor takes is refused, not decoded as the wrong
//! message: the two types' fingerprints travel with every send and reply.

mod common;

use std::time::Duration;

use common::*;
use maquis::{CallError, Inbox, Node, ReplyTo, SendError};
use serde::{Deserialize, Serialize};

/// What the bank's actor takes.
#[derive(Debug, Serialize, Deserialize)]
enum Account {
    Deposit { cents: u64 },
    Withdraw { cents: u64 },
    Balance(ReplyTo<u64>),
}

/// Another enum of the same shape, its first variant a withdrawal: postcard alone would decode
/// `Withdraw { cents: 500 }` as `Deposit { cents: 500 }`.
#[derive(Debug, Serialize, Deserialize)]
enum Teller {
    Withdraw { cents: u64 },
    Deposit { cents: u64 },
    Balance(ReplyTo<u64>),
}

/// The bank's type on the wire, but expecting the balance as text.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "Account")]
enum TextAccount {
    Deposit { cents: u64 },
    Withdraw { cents: u64 },
    Balance(ReplyTo<String>),
}

async fn pair() -> (Node, Node) {
    let a = start("ty1").await;
    let b = start("ty2").await;
    b.join_wait(a.addr(), Duration::from_secs(5)).await.unwrap();
    until("a and b see each other", Duration::from_secs(5), || {
        let ok = a.member("ty2").is_some() && b.member("ty1").is_some();
        async move { ok }
    })
    .await;
    let bank = b.spawn_fn(|mut inbox: Inbox<Account>| async move {
        let mut cents = 1_000u64;
        while let Some(m) = inbox.recv().await {
            match m {
                Account::Deposit { cents: c } => cents += c,
                Account::Withdraw { cents: c } => cents -= c,
                Account::Balance(r) => {
                    let _ = r.send(cents).await;
                }
            }
        }
    });
    b.register("bank", &bank).unwrap();
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_another_type_is_refused_not_misread() {
    let (a, b) = pair().await;
    let wrong = a.remote::<Teller>("ty2", "bank").unwrap();
    // Fire and forget: refused at the receiver, counted.
    wrong.send(Teller::Withdraw { cents: 500 }).await.unwrap();
    until("the refusal is counted", Duration::from_secs(5), || {
        let n = b.counters().type_mismatch.get();
        async move { n == 1 }
    })
    .await;
    // A call: the caller hears why, at once.
    let err = wrong
        .call(Teller::Balance, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CallError::Send(SendError::TypeMismatch)),
        "{err:?}"
    );
    // The balance was not touched by the refused message: no deposit of 500 happened.
    let right = a.remote::<Account>("ty2", "bank").unwrap();
    let balance = right
        .call(Account::Balance, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(balance, 1_000);
    right.send(Account::Withdraw { cents: 300 }).await.unwrap();
    let balance = right
        .call(Account::Balance, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(balance, 700);
    assert_eq!(b.counters().type_mismatch.get(), 2);
    assert_eq!(b.counters().decode_errors.get(), 0);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_of_another_type_is_refused_at_the_caller() {
    let (a, b) = pair().await;
    let text = a.remote::<TextAccount>("ty2", "bank").unwrap();
    // The request's type matches on the wire (same names and shape); the reply is a u64
    // where the caller expects a String.
    let err = text
        .call(TextAccount::Balance, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Decode(why) if why.contains("another type")),
        "{err:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}
