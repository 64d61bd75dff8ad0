//! [`Netem`]: building an emulated network, controlling it through a
//! [`NetemHandle`], and tearing it down.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::control::{self, ControlServer};
use crate::stats::{lateness_warning, DirectionStats, HostStats, LatenessStats};
use crate::tun::{Tun, MAX_FRAME, TUN_PATH};
use crate::wire::{Params, Wire, WireLimits, WireState};
use crate::{ns, sys, NetemError, NetemStats, Rate};

/// Name of the TUN device inside every host namespace.
pub const DEVICE_NAME: &str = "netem0";

/// Sysctls recorded in every report (read inside the first host).
const REPORTED_SYSCTLS: [&str; 5] = [
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.core.rmem_max",
    "net.core.wmem_max",
];

/// How to build an emulated network. Start from [`Default`] and override:
///
/// ```no_run
/// # use maquis_netem::{Netem, NetemConfig};
/// # use std::time::Duration;
/// let net = Netem::up(NetemConfig {
///     hosts: 3,
///     delay: Duration::from_millis(10),
///     ..Default::default()
/// })?;
/// # Ok::<(), maquis_netem::NetemError>(())
/// ```
#[derive(Debug, Clone)]
pub struct NetemConfig {
    /// Number of hosts (1–254). Host `i` (1-based) is namespace
    /// `{prefix}-h{i}` with address `{network}.{i}`.
    pub hosts: usize,
    /// One-way delay added on every traversal of the wire, so a ping's RTT
    /// is twice this.
    pub delay: Duration,
    /// Rate limit of each host's link, applied separately to the host's
    /// uplink (what it sends) and downlink (what it receives). `None` =
    /// unlimited.
    pub rate: Option<Rate>,
    /// Probability in `[0, 1]` that a frame is dropped.
    pub loss: f64,
    /// Prefix of namespace names; namespaces `{prefix}-h<digits>` left over
    /// from an earlier run are deleted at start.
    pub prefix: String,
    /// The /24 network the hosts live in; the last octet must be 0.
    pub network: Ipv4Addr,
    /// MTU of the host devices (GSO segments are larger; that is normal).
    pub mtu: u32,
    /// Enable checksum/TSO offload on the TUN devices (64 KB segments).
    /// Without it the wire carries MTU-sized packets and loss applies per
    /// packet rather than per GSO segment.
    pub offload: bool,
    /// Run the wire threads at SCHED_FIFO priority (falls back with a
    /// warning when not permitted).
    pub realtime: bool,
    /// Byte limit of each direction's queue; frames beyond it are dropped
    /// (tail drop) and counted.
    pub delay_queue_bytes: u64,
    /// Byte limit of each rate limiter's backlog; `None` = 20 ms worth of
    /// the rate, at least 256 KiB. Tail drop, counted.
    pub rate_queue_bytes: Option<u64>,
    /// Token-bucket depth of the rate limiter in bytes.
    pub burst_bytes: u64,
    /// Where to serve the control socket; `None` = no socket (use the
    /// [`NetemHandle`] instead).
    pub control: Option<PathBuf>,
    /// Sysctls (`key`, `value`) to set inside every host namespace, e.g.
    /// `("net.ipv4.tcp_rmem", "4096 131072 33554432")`.
    pub sysctls: Vec<(String, String)>,
    /// Seed for the loss generator, for reproducible runs.
    pub seed: Option<u64>,
}

impl Default for NetemConfig {
    fn default() -> Self {
        NetemConfig {
            hosts: 2,
            delay: Duration::ZERO,
            rate: None,
            loss: 0.0,
            prefix: "mq".into(),
            network: Ipv4Addr::new(10, 77, 0, 0),
            mtu: 1500,
            offload: true,
            realtime: true,
            delay_queue_bytes: 64 * 1024 * 1024,
            rate_queue_bytes: None,
            burst_bytes: 128 * 1024,
            control: None,
            sysctls: Vec::new(),
            seed: None,
        }
    }
}

impl NetemConfig {
    /// The default control socket path for `prefix`:
    /// `/run/maquis-netem-{prefix}.sock`.
    pub fn default_control_path(prefix: &str) -> PathBuf {
        PathBuf::from(format!("/run/maquis-netem-{prefix}.sock"))
    }

    /// Checks ranges and consistency.
    pub fn validate(&self) -> Result<(), NetemError> {
        let bad = |m: String| Err(NetemError::InvalidConfig(m));
        if !(1..=254).contains(&self.hosts) {
            return bad(format!("hosts must be 1..=254, got {}", self.hosts));
        }
        if self.prefix.len() > 32 {
            return bad(format!("prefix {:?} is longer than 32 bytes", self.prefix));
        }
        ns::validate_name(&self.prefix)?;
        if self.network.octets()[3] != 0 {
            return bad(format!("network {} must end in .0 (a /24)", self.network));
        }
        if !(0.0..=1.0).contains(&self.loss) {
            return bad(format!("loss {} is not in [0, 1]", self.loss));
        }
        if !(68..=65535).contains(&self.mtu) {
            return bad(format!("mtu {} is not in 68..=65535", self.mtu));
        }
        if self.delay_queue_bytes < MAX_FRAME as u64 {
            return bad(format!(
                "delay_queue_bytes {} is below one maximal frame ({MAX_FRAME})",
                self.delay_queue_bytes
            ));
        }
        if self.rate.is_some_and(|r| r.bits_per_sec() < 8) {
            return bad("rate must be at least 8bit".into());
        }
        for (k, _) in &self.sysctls {
            if !k.starts_with("net.") && !k.starts_with("net/") {
                return bad(format!("sysctl {k:?}: only net.* keys are per-namespace"));
            }
        }
        Ok(())
    }

    fn host_name(&self, i: usize) -> String {
        format!("{}-h{}", self.prefix, i + 1)
    }
}

/// One emulated host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// 0-based index, as used by [`Netem::command`] and
    /// [`NetemHandle::partition`].
    pub index: usize,
    /// Namespace name, e.g. `mq-h1` for index 0.
    pub name: String,
    /// The host's address.
    pub addr: Ipv4Addr,
    /// Name of its TUN device inside the namespace ([`DEVICE_NAME`]).
    pub device: String,
}

#[derive(Debug)]
struct HandleInner {
    state: Arc<WireState>,
    hosts: Vec<Host>,
    prefix: String,
    sysctls: BTreeMap<String, String>,
}

/// A cheap, clonable, thread-safe handle to change a running network and
/// read its statistics. Obtained from [`Netem::handle`]; [`Netem`] also
/// dereferences to it. After the network is torn down the handle still
/// works but nothing flows any more.
#[derive(Debug, Clone)]
pub struct NetemHandle {
    inner: Arc<HandleInner>,
}

impl NetemHandle {
    /// The hosts, in index order.
    pub fn hosts(&self) -> &[Host] {
        &self.inner.hosts
    }

    /// The current one-way delay.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.inner.state.params.delay_ns())
    }

    /// Sets the one-way delay for frames entering the wire from now on.
    /// Frames never overtake earlier frames of the same direction, so after
    /// a decrease new frames may wait behind old ones for up to the old
    /// delay.
    pub fn set_delay(&self, delay: Duration) {
        tracing::info!(delay = ?delay, "netem: set one-way delay");
        self.inner.state.params.set_delay(delay);
    }

    /// The current loss probability.
    pub fn loss(&self) -> f64 {
        self.inner.state.params.loss()
    }

    /// Sets the loss probability (in `[0, 1]`).
    pub fn set_loss(&self, loss: f64) -> Result<(), NetemError> {
        if !(0.0..=1.0).contains(&loss) {
            return Err(NetemError::InvalidConfig(format!(
                "loss {loss} is not in [0, 1]"
            )));
        }
        tracing::info!(loss, "netem: set loss");
        self.inner.state.params.set_loss(loss);
        Ok(())
    }

    /// The current per-link rate limit.
    pub fn rate(&self) -> Option<Rate> {
        match self.inner.state.params.rate_bytes() {
            0 => None,
            b => Some(Rate::from_bits_per_sec(b.saturating_mul(8))),
        }
    }

    /// Sets or removes the per-link rate limit.
    pub fn set_rate(&self, rate: Option<Rate>) {
        tracing::info!(rate = ?rate.map(|r| r.to_string()), "netem: set rate");
        self.inner
            .state
            .params
            .set_rate_bytes(rate.map_or(0, |r| r.bytes_per_sec()));
    }

    /// Cuts the hosts with these indices off from all other hosts: frames
    /// between the two sides are dropped both ways (including frames
    /// already in flight). Replaces any earlier partition; an empty slice
    /// heals.
    pub fn partition(&self, group: &[usize]) -> Result<(), NetemError> {
        if let Some(&bad) = group.iter().find(|&&i| i >= self.inner.hosts.len()) {
            return Err(NetemError::UnknownHost(format!("index {bad}")));
        }
        tracing::info!(?group, "netem: partition");
        self.inner.state.params.partition(group);
        Ok(())
    }

    /// Removes any partition.
    pub fn heal(&self) {
        tracing::info!("netem: heal");
        self.inner.state.params.heal();
    }

    /// Indices of the hosts currently cut off (empty when healed).
    pub fn partitioned(&self) -> Vec<usize> {
        self.inner.state.params.partition_group()
    }

    /// Finds a host by namespace name (`mq-h1`), short name (`h1`), 1-based
    /// number (`1`) or address (`10.77.0.1`); returns its index.
    pub fn resolve_host(&self, spec: &str) -> Result<usize, NetemError> {
        let spec = spec.trim();
        let hosts = &self.inner.hosts;
        if let Some(h) = hosts.iter().find(|h| {
            h.name == spec || h.addr.to_string() == spec || h.name.ends_with(&format!("-{spec}"))
        }) {
            return Ok(h.index);
        }
        match spec.parse::<usize>() {
            Ok(n) if (1..=hosts.len()).contains(&n) => Ok(n - 1),
            _ => Err(NetemError::UnknownHost(spec.to_string())),
        }
    }

    /// Zeroes all counters and the lateness histogram (e.g. after warm-up).
    pub fn reset_stats(&self) {
        let st = &self.inner.state;
        st.counters.reset(st.now_ns());
    }

    /// A snapshot of configuration, counters, rates and lateness.
    pub fn stats(&self) -> NetemStats {
        let st = &self.inner.state;
        let hosts = &self.inner.hosts;
        let n = st.hosts;
        let now = st.now_ns();
        let since = st.counters.since_ns.load(Relaxed);
        let queued = st.queued_bytes();
        let mut directions = Vec::new();
        let mut total = DirectionStats {
            from: "*".into(),
            to: "*".into(),
            ..Default::default()
        };
        let (mut t_first, mut t_last) = (u64::MAX, 0u64);
        for (dir, c) in st.counters.dirs.iter().enumerate() {
            let (src, dst) = (dir / n, dir % n);
            let first = c.first_ns.load(Relaxed);
            let last = c.last_ns.load(Relaxed);
            let mut d = DirectionStats {
                from: hosts[src].name.clone(),
                to: hosts[dst].name.clone(),
                packets: c.packets.load(Relaxed),
                bytes: c.bytes.load(Relaxed),
                queued_bytes: queued.get(dir).copied().unwrap_or(0),
                dropped_loss: c.drop_loss.load(Relaxed),
                dropped_partition: c.drop_partition.load(Relaxed),
                dropped_queue_full: c.drop_queue.load(Relaxed),
                dropped_rate_queue_full: c.drop_rate_queue.load(Relaxed),
                write_errors: c.write_errors.load(Relaxed),
                ..Default::default()
            };
            if d.packets == 0 && d.dropped() == 0 && d.queued_bytes == 0 {
                continue;
            }
            if first != u64::MAX {
                t_first = t_first.min(first);
                t_last = t_last.max(last);
            }
            set_rates(&mut d, first, last);
            total.packets += d.packets;
            total.bytes += d.bytes;
            total.queued_bytes += d.queued_bytes;
            total.dropped_loss += d.dropped_loss;
            total.dropped_partition += d.dropped_partition;
            total.dropped_queue_full += d.dropped_queue_full;
            total.dropped_rate_queue_full += d.dropped_rate_queue_full;
            total.write_errors += d.write_errors;
            directions.push(d);
        }
        set_rates(&mut total, t_first, t_last);
        let host_stats = hosts
            .iter()
            .zip(&st.counters.hosts)
            .map(|(h, c)| HostStats {
                name: h.name.clone(),
                address: h.addr.to_string(),
                rx_packets: c.rx_packets.load(Relaxed),
                rx_bytes: c.rx_bytes.load(Relaxed),
                unroutable: c.unroutable.load(Relaxed),
                read_errors: c.read_errors.load(Relaxed),
            })
            .collect();
        let lateness = LatenessStats::from_histogram(
            &st.counters
                .lateness
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let delay_us = st.params.delay_ns() as f64 / 1e3;
        let realtime = st.realtime.load(Relaxed);
        let mut warnings = Vec::new();
        if st.limits.realtime && !realtime {
            warnings.push("the wire is not running at real-time priority".to_string());
        }
        warnings.extend(lateness_warning(&lateness, delay_us, realtime));
        NetemStats {
            prefix: self.inner.prefix.clone(),
            elapsed_s: now.saturating_sub(since) as f64 / 1e9,
            delay_us,
            loss: st.params.loss(),
            rate_bit_s: self.rate().map(Rate::bits_per_sec),
            partition: self
                .partitioned()
                .into_iter()
                .map(|i| hosts[i].name.clone())
                .collect(),
            offload: st.offload,
            realtime,
            hosts: host_stats,
            directions,
            total,
            lateness,
            warnings,
            sysctls: self.inner.sysctls.clone(),
        }
    }
}

fn set_rates(d: &mut DirectionStats, first: u64, last: u64) {
    if first == u64::MAX || last <= first {
        return;
    }
    let secs = (last - first) as f64 / 1e9;
    d.active_s = secs;
    d.packets_per_s = d.packets.saturating_sub(1) as f64 / secs;
    d.gbit_per_s = d.bytes as f64 * 8.0 / secs / 1e9;
}

/// A running emulated network. Dropping it (or calling
/// [`Netem::shutdown`]) stops the wire and deletes every namespace and
/// device it made. Dereferences to its [`NetemHandle`].
#[derive(Debug)]
pub struct Netem {
    handle: NetemHandle,
    control: Option<ControlServer>,
    wire: Option<Wire>,
    tuns: Option<Arc<Vec<Tun>>>,
    namespaces: Namespaces,
}

/// Namespaces created so far; deleted on drop.
#[derive(Debug, Default)]
struct Namespaces(Vec<String>);

impl Namespaces {
    fn delete_all(&mut self) -> Result<(), NetemError> {
        let mut first_err = None;
        for name in self.0.drain(..).rev() {
            if let Err(e) = ns::delete(&name) {
                tracing::warn!(namespace = %name, error = %e, "cannot delete namespace");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = self.delete_all();
    }
}

/// Deletes namespaces named `{prefix}-h<digits>` (left by a killed run).
/// Returns their names.
pub fn cleanup_stale(prefix: &str) -> Result<Vec<String>, NetemError> {
    ns::validate_name(prefix)?;
    let stem = format!("{prefix}-h");
    let mut removed = Vec::new();
    for name in ns::list()? {
        let is_ours = name
            .strip_prefix(&stem)
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()));
        if is_ours {
            tracing::info!(namespace = %name, "deleting stale namespace");
            ns::delete(&name)?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// Checks root and TUN support, with the crate's specific errors.
pub fn preflight() -> Result<(), NetemError> {
    sys::require_root()?;
    if !Path::new(TUN_PATH).exists() {
        return Err(NetemError::NoTunDevice {
            path: TUN_PATH.into(),
        });
    }
    Ok(())
}

impl Netem {
    /// Builds the network and starts the wire: deletes stale namespaces with
    /// the same prefix, creates one namespace + TUN device per host,
    /// configures addresses, starts the wire threads and (if configured)
    /// the control socket. On error everything made so far is removed.
    pub fn up(config: NetemConfig) -> Result<Netem, NetemError> {
        config.validate()?;
        preflight()?;
        if let Some(path) = &config.control {
            if control::is_live(path) {
                return Err(NetemError::AlreadyRunning { path: path.clone() });
            }
        }
        cleanup_stale(&config.prefix)?;

        let mut namespaces = Namespaces::default();
        let mut tuns = Vec::with_capacity(config.hosts);
        let mut hosts = Vec::with_capacity(config.hosts);
        let net = config.network.octets();
        for i in 0..config.hosts {
            let name = config.host_name(i);
            ns::add(&name)?;
            namespaces.0.push(name.clone());
            let addr = Ipv4Addr::new(net[0], net[1], net[2], (i + 1) as u8);
            let (offload, sysctls) = (config.offload, config.sysctls.clone());
            let tun = ns::in_netns(&name, move || {
                let tun = Tun::create(DEVICE_NAME, offload)?;
                for (k, v) in &sysctls {
                    ns::write_sysctl(k, v)?;
                }
                Ok::<_, NetemError>(tun)
            })??;
            let script = format!(
                "link set dev lo up\n\
                 link set dev {DEVICE_NAME} mtu {mtu}\n\
                 addr add {addr}/24 dev {DEVICE_NAME}\n\
                 link set dev {DEVICE_NAME} up\n",
                mtu = config.mtu
            );
            ns::ip_with_stdin(&["-n", &name, "-batch", "-"], Some(&script))?;
            tuns.push(tun);
            hosts.push(Host {
                index: i,
                name,
                addr,
                device: DEVICE_NAME.to_string(),
            });
        }
        let sysctls = ns::in_netns(&hosts[0].name, || {
            REPORTED_SYSCTLS
                .iter()
                .filter_map(|k| ns::read_sysctl(k).ok().map(|v| (k.to_string(), v)))
                .collect::<BTreeMap<_, _>>()
        })?;

        let state = Arc::new(WireState::new(
            config.hosts,
            [net[0], net[1], net[2]],
            Params::new(
                config.hosts,
                config.delay,
                config.loss,
                config.rate.map_or(0, |r| r.bytes_per_sec()),
            ),
            WireLimits {
                delay_queue_bytes: config.delay_queue_bytes,
                rate_queue_bytes: config.rate_queue_bytes,
                burst_bytes: config.burst_bytes,
                realtime: config.realtime,
                seed: config.seed,
            },
            config.offload,
        ));
        let handle = NetemHandle {
            inner: Arc::new(HandleInner {
                state: state.clone(),
                hosts,
                prefix: config.prefix.clone(),
                sysctls,
            }),
        };
        let tuns = Arc::new(tuns);
        let mut netem = Netem {
            handle: handle.clone(),
            control: None,
            wire: None,
            tuns: Some(tuns.clone()),
            namespaces,
        };
        netem.wire = Some(Wire::start(state, tuns)?);
        if let Some(path) = &config.control {
            netem.control = Some(ControlServer::start(path, handle)?);
        }
        tracing::info!(
            prefix = %config.prefix,
            hosts = config.hosts,
            delay = ?config.delay,
            loss = config.loss,
            rate = ?config.rate.map(|r| r.to_string()),
            "netem up"
        );
        Ok(netem)
    }

    /// A clonable handle for run-time control and statistics.
    pub fn handle(&self) -> NetemHandle {
        self.handle.clone()
    }

    /// The host at `index`, if any.
    pub fn host(&self, index: usize) -> Option<&Host> {
        self.handle.hosts().get(index)
    }

    /// A [`Command`] that runs `program` inside host `index`'s namespace
    /// (`ip netns exec NAME program`); add arguments with `.arg(…)`.
    ///
    /// # Panics
    /// If `index` is not below `hosts().len()`; see [`Netem::try_command`].
    pub fn command(&self, index: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match self.try_command(index, program) {
            Ok(c) => c,
            Err(_) => panic!(
                "host index {index} out of range (network has {} hosts)",
                self.hosts().len()
            ),
        }
    }

    /// Like [`Netem::command`] but fails for an unknown host index.
    pub fn try_command(
        &self,
        index: usize,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<Command, NetemError> {
        let host = self
            .host(index)
            .ok_or_else(|| NetemError::UnknownHost(format!("index {index}")))?;
        Ok(host_command(&host.name, program))
    }

    /// Runs `f` on a thread inside host `index`'s namespace and returns its
    /// result. Sockets created by `f` stay in that namespace and can be used
    /// from any thread afterwards:
    ///
    /// ```no_run
    /// # let net = maquis_netem::Netem::up(Default::default())?;
    /// let listener = net.run_in_host(1, || std::net::TcpListener::bind("10.77.0.2:5000"))??;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// The outer error means the namespace could not be entered (or `f`
    /// panicked).
    pub fn run_in_host<F, R>(&self, index: usize, f: F) -> Result<R, NetemError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let host = self
            .host(index)
            .ok_or_else(|| NetemError::UnknownHost(format!("index {index}")))?;
        ns::in_netns(&host.name, f)
    }

    /// Spawns a thread inside host `index`'s namespace running `f`. Joining
    /// it yields `Err` if the namespace could not be entered.
    pub fn spawn_in_host<F, R>(
        &self,
        index: usize,
        f: F,
    ) -> Result<JoinHandle<Result<R, NetemError>>, NetemError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let host = self
            .host(index)
            .ok_or_else(|| NetemError::UnknownHost(format!("index {index}")))?;
        ns::spawn_in_netns(&host.name, f)
    }

    /// Stops the wire, removes the control socket and deletes every
    /// namespace (and so every device). Returns the final statistics.
    pub fn shutdown(mut self) -> Result<NetemStats, NetemError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<NetemStats, NetemError> {
        self.control.take();
        if let Some(mut wire) = self.wire.take() {
            wire.stop(&self.handle.inner.state);
        }
        let stats = self.handle.stats();
        // Closing the descriptors destroys the (non-persistent) devices.
        self.tuns.take();
        self.namespaces.delete_all()?;
        tracing::info!(prefix = %self.handle.inner.prefix, "netem down");
        Ok(stats)
    }
}

impl std::ops::Deref for Netem {
    type Target = NetemHandle;

    fn deref(&self) -> &NetemHandle {
        &self.handle
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        if self.wire.is_some() || !self.namespaces.0.is_empty() {
            if let Err(e) = self.teardown() {
                tracing::warn!(error = %e, "netem teardown incomplete");
            }
        }
    }
}

/// A [`Command`] running `program` in namespace `name` via `ip netns exec`.
pub fn host_command(name: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", name]).arg(program);
    c
}
