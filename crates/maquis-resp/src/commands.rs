//! The commands the RESP front understands.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, StreamExt};

use super::reply::Reply;
use super::ServerState;
use crate::store::{Store, StoreError};

/// Per-connection state.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    pub id: u64,
    pub name: Option<Bytes>,
    /// `CLIENT REPLY OFF`.
    pub replies_off: bool,
    /// No reply for the command running now (`CLIENT REPLY OFF|SKIP` itself, or the command
    /// after a `SKIP`).
    pub silent: bool,
    /// `CLIENT REPLY SKIP`: no reply for the next command.
    pub skip_next: bool,
}

impl ConnState {
    /// Whether the reply of the command just run is sent; moves the `SKIP` on.
    pub fn take_reply(&mut self) -> bool {
        let send = !self.replies_off && !self.silent;
        self.silent = std::mem::take(&mut self.skip_next);
        send
    }
}

/// The commands listed by `COMMAND COUNT` and `INFO`.
pub const COMMANDS: &[&str] = &[
    "PING", "ECHO", "GET", "SET", "DEL", "EXISTS", "MGET", "MSET", "HSET", "HMSET", "HGET",
    "HMGET", "HGETALL", "HDEL", "KEYSFROM", "INFO", "COMMAND", "CLIENT", "SELECT", "QUIT",
    "CONFIG", "HELLO",
];

fn arity(name: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

fn store_err(e: StoreError) -> Reply {
    Reply::Error(e.0)
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

/// Runs `test` on every key, `batch` at a time, and answers how many passed (the first
/// failure, if any, instead): what `DEL` and `EXISTS` reply.
async fn count_keys<S, F, Fut>(store: &Arc<S>, keys: &[Bytes], batch: usize, test: F) -> Reply
where
    F: Fn(Arc<S>, Bytes) -> Fut,
    Fut: std::future::Future<Output = Result<bool, StoreError>>,
{
    let results: Vec<Result<bool, StoreError>> = stream::iter(keys.to_vec())
        .map(|k| test(store.clone(), k))
        .buffered(batch)
        .collect()
        .await;
    let mut count = 0;
    let mut failure = None;
    for r in results {
        match r {
            Ok(true) => count += 1,
            Ok(false) => {}
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    match failure {
        Some(e) => store_err(e),
        None => Reply::Int(count),
    }
}

/// Whether a request only reads the store and does not touch the connection's state (`GET`,
/// `EXISTS`, `MGET`, `HGET`, `HMGET`, `HGETALL`, `KEYSFROM`, `PING`, `ECHO`): consecutive
/// reads of a pipeline may run at once, as no reply of one depends on another.
pub(crate) fn is_read(args: &[Bytes]) -> bool {
    let Some(first) = args.first() else {
        return false;
    };
    matches!(
        upper(first).as_str(),
        "GET" | "EXISTS" | "MGET" | "HGET" | "HMGET" | "HGETALL" | "KEYSFROM" | "PING" | "ECHO"
    )
}

/// Runs a request that [`is_read`] (it needs no connection state).
pub(crate) async fn execute_read<S: Store>(state: &ServerState<S>, args: Vec<Bytes>) -> Reply {
    debug_assert!(is_read(&args));
    execute(state, &mut ConnState::default(), args).await.0
}

/// Runs one request; returns the reply and whether to close the connection after it.
pub(crate) async fn execute<S: Store>(
    state: &ServerState<S>,
    conn: &mut ConnState,
    args: Vec<Bytes>,
) -> (Reply, bool) {
    let Some(first) = args.first() else {
        return (Reply::err("empty command"), false);
    };
    let name = upper(first);
    let store = &state.store;
    let n = args.len();
    let batch = state.config.max_batch.max(1);
    let reply = match name.as_str() {
        "PING" => match n {
            1 => Reply::Simple("PONG"),
            2 => Reply::Bulk(Some(args[1].clone())),
            _ => arity(&name),
        },
        "ECHO" if n == 2 => Reply::Bulk(Some(args[1].clone())),
        "GET" if n == 2 => match store.get(args[1].clone()).await {
            Ok(v) => Reply::Bulk(v),
            Err(e) => store_err(e),
        },
        "SET" if n == 3 => match store.set(args[1].clone(), args[2].clone()).await {
            Ok(()) => Reply::ok(),
            Err(e) => store_err(e),
        },
        "SET" if n > 3 => Reply::err("syntax error (SET options are not supported)"),
        "DEL" if n >= 2 => {
            count_keys(
                store,
                &args[1..],
                batch,
                |s, k| async move { s.del(k).await },
            )
            .await
        }
        "EXISTS" if n >= 2 => {
            count_keys(
                store,
                &args[1..],
                batch,
                |s, k| async move { s.exists(k).await },
            )
            .await
        }
        "MGET" if n >= 2 => {
            let results: Vec<Result<Option<Bytes>, StoreError>> = stream::iter(args[1..].to_vec())
                .map(|k| {
                    let store = store.clone();
                    async move { store.get(k).await }
                })
                .buffered(batch)
                .collect()
                .await;
            match results.into_iter().collect::<Result<Vec<_>, _>>() {
                Ok(values) => Reply::Array(values.into_iter().map(Reply::Bulk).collect()),
                Err(e) => store_err(e),
            }
        }
        "MSET" if n >= 3 && n % 2 == 1 => {
            let results: Vec<Result<(), StoreError>> = stream::iter(
                args[1..]
                    .chunks(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect::<Vec<_>>(),
            )
            .map(|(k, v)| {
                let store = store.clone();
                async move { store.set(k, v).await }
            })
            .buffered(batch)
            .collect()
            .await;
            match results.into_iter().find_map(Result::err) {
                Some(e) => store_err(e),
                None => Reply::ok(),
            }
        }
        "HSET" | "HMSET" if n >= 4 && n.is_multiple_of(2) => {
            let fields = args[2..]
                .chunks(2)
                .map(|fv| (fv[0].clone(), fv[1].clone()))
                .collect();
            match store.hset(args[1].clone(), fields).await {
                Ok(added) if name == "HSET" => Reply::Int(added),
                Ok(_) => Reply::ok(),
                Err(e) => store_err(e),
            }
        }
        "HGET" if n == 3 => match store.hmget(args[1].clone(), vec![args[2].clone()]).await {
            Ok(mut v) => Reply::Bulk(v.pop().flatten()),
            Err(e) => store_err(e),
        },
        "HMGET" if n >= 3 => match store.hmget(args[1].clone(), args[2..].to_vec()).await {
            Ok(v) => Reply::Array(v.into_iter().map(Reply::Bulk).collect()),
            Err(e) => store_err(e),
        },
        "HGETALL" if n == 2 => match store.hgetall(args[1].clone()).await {
            Ok(fields) => Reply::Array(
                fields
                    .into_iter()
                    .flat_map(|(f, v)| [Reply::Bulk(Some(f)), Reply::Bulk(Some(v))])
                    .collect(),
            ),
            Err(e) => store_err(e),
        },
        "HDEL" if n >= 3 => match store.hdel(args[1].clone(), args[2..].to_vec()).await {
            Ok(n) => Reply::Int(n),
            Err(e) => store_err(e),
        },
        "KEYSFROM" if n == 3 => match std::str::from_utf8(&args[2])
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
        {
            Some(count) if count <= crate::MAX_KEYSFROM => {
                match store.keys_from(args[1].clone(), count).await {
                    Ok(keys) => Reply::Array(
                        keys.into_iter()
                            .take(count)
                            .map(|k| Reply::Bulk(Some(k)))
                            .collect(),
                    ),
                    Err(e) => store_err(e),
                }
            }
            _ => Reply::err(format!(
                "count is not an integer from 0 to {}",
                crate::MAX_KEYSFROM
            )),
        },
        "INFO" if n <= 2 => {
            let section = args
                .get(1)
                .map(|s| String::from_utf8_lossy(s).to_lowercase());
            Reply::text(super::info::render(state, section.as_deref()).await)
        }
        "COMMAND" => match args.get(1).map(|s| upper(s)).as_deref() {
            None | Some("DOCS") | Some("INFO") | Some("LIST") => Reply::Array(Vec::new()),
            Some("COUNT") => Reply::Int(COMMANDS.len() as i64),
            Some(other) => Reply::err(format!("unknown subcommand '{other}'")),
        },
        "CLIENT" if n >= 2 => client(state, conn, &args),
        "SELECT" if n == 2 => match args[1].as_ref() {
            b"0" => Reply::ok(),
            _ => Reply::err("DB index is out of range"),
        },
        "QUIT" => return (Reply::ok(), true),
        "CONFIG" if n >= 2 => match upper(&args[1]).as_str() {
            "GET" if n == 3 => match String::from_utf8_lossy(&args[2]).to_lowercase().as_str() {
                "save" => Reply::Array(vec![Reply::text("save"), Reply::text("")]),
                "appendonly" => Reply::Array(vec![Reply::text("appendonly"), Reply::text("no")]),
                _ => Reply::Array(Vec::new()),
            },
            "RESETSTAT" => Reply::ok(),
            other => Reply::err(format!("CONFIG {other} is not supported")),
        },
        "HELLO" => match args.get(1).map(|v| v.as_ref()) {
            None | Some(b"2") => Reply::Array(vec![
                Reply::text("server"),
                Reply::text("redis"),
                Reply::text("version"),
                Reply::text(super::info::REDIS_VERSION),
                Reply::text("proto"),
                Reply::Int(2),
                Reply::text("id"),
                Reply::Int(conn.id as i64),
                Reply::text("mode"),
                Reply::text("standalone"),
                Reply::text("role"),
                Reply::text("master"),
                Reply::text("modules"),
                Reply::Array(Vec::new()),
            ]),
            Some(_) => Reply::Error("NOPROTO unsupported protocol version".into()),
        },
        "ECHO" | "GET" | "SET" | "DEL" | "EXISTS" | "MGET" | "MSET" | "HSET" | "HMSET" | "HGET"
        | "HMGET" | "HGETALL" | "HDEL" | "KEYSFROM" | "INFO" | "CLIENT" | "SELECT" | "CONFIG" => {
            arity(&name)
        }
        _ => {
            let mut shown = String::new();
            for a in args.iter().skip(1).take(8) {
                shown.push('\'');
                shown.push_str(&String::from_utf8_lossy(&a[..a.len().min(64)]));
                shown.push_str("' ");
            }
            let cmd = String::from_utf8_lossy(&first[..first.len().min(128)]).to_string();
            Reply::err(format!(
                "unknown command '{cmd}', with args beginning with: {shown}"
            ))
        }
    };
    (reply, false)
}

fn client<S: Store>(state: &ServerState<S>, conn: &mut ConnState, args: &[Bytes]) -> Reply {
    match upper(&args[1]).as_str() {
        "SETNAME" if args.len() == 3 => {
            if args[2].iter().any(|b| *b <= b' ') {
                return Reply::err(
                    "Client names cannot contain spaces, newlines or special characters.",
                );
            }
            conn.name = (!args[2].is_empty()).then(|| args[2].clone());
            Reply::ok()
        }
        "GETNAME" => Reply::Bulk(conn.name.clone()),
        "ID" => Reply::Int(conn.id as i64),
        "SETINFO" | "NO-EVICT" | "NO-TOUCH" => Reply::ok(),
        "REPLY" if args.len() == 3 => match upper(&args[2]).as_str() {
            "ON" => {
                conn.replies_off = false;
                Reply::ok()
            }
            "OFF" => {
                conn.replies_off = true;
                conn.silent = true;
                Reply::ok()
            }
            "SKIP" => {
                conn.silent = true;
                conn.skip_next = !conn.replies_off;
                Reply::ok()
            }
            _ => Reply::err("syntax error"),
        },
        "INFO" | "LIST" => Reply::text(format!(
            "id={} name={} connected_clients={}\n",
            conn.id,
            conn.name
                .as_ref()
                .map(|n| String::from_utf8_lossy(n).to_string())
                .unwrap_or_default(),
            state.clients.load(Ordering::Relaxed)
        )),
        other => Reply::err(format!(
            "unknown subcommand or wrong number of arguments for '{other}'"
        )),
    }
}
