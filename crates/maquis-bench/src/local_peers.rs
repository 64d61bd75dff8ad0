//! The peers of `maquis-bench local`: the same workloads ([`crate::local_cell`]) on actix,
//! ractor and kameo, each used the way its documentation shows: actix actors on its own
//! single-threaded system with `do_send` (which does not wait for mailbox room) and `send` for
//! calls; ractor's `cast` (its mailboxes are unbounded) and `call`; kameo's `tell` and `ask` on
//! its default bounded mailbox.

use std::sync::Arc;

use crate::local_cell::{
    calls, idle, stamp, stream, told, Ask, LocalCellArgs, Msg, Outcome, Sink, Started, Tell,
    Workload,
};

// ---- actix ----

impl actix::Message for Msg {
    type Result = ();
}

/// The receiving actor of the one-way workloads.
struct ActixSink(Sink);

impl actix::Actor for ActixSink {
    type Context = actix::Context<Self>;
}

impl actix::Handler<Msg> for ActixSink {
    type Result = ();
    fn handle(&mut self, m: Msg, _: &mut Self::Context) {
        self.0.take(m);
    }
}

/// A call: answered with its number.
struct ActixAsk(u64);

impl actix::Message for ActixAsk {
    type Result = u64;
}

struct ActixServer;

impl actix::Actor for ActixServer {
    type Context = actix::Context<Self>;
}

impl actix::Handler<ActixAsk> for ActixServer {
    type Result = u64;
    fn handle(&mut self, m: ActixAsk, _: &mut Self::Context) -> u64 {
        m.0
    }
}

struct ActixIdle(Arc<Started>);

impl actix::Actor for ActixIdle {
    type Context = actix::Context<Self>;
}

impl actix::Handler<Msg> for ActixIdle {
    type Result = ();
    fn handle(&mut self, _: Msg, _: &mut Self::Context) {
        self.0.one();
    }
}

impl<A> Tell for actix::Addr<A>
where
    A: actix::Actor + actix::Handler<Msg>,
    A::Context: actix::dev::ToEnvelope<A, Msg>,
{
    async fn tell(&self, m: Msg) {
        self.do_send(m);
    }
}

impl Ask for actix::Addr<ActixServer> {
    async fn ask(&self, x: u64) -> u64 {
        self.send(ActixAsk(x)).await.unwrap_or(u64::MAX)
    }
}

/// Runs an actix cell on actix's own system (a single-threaded runtime).
pub fn actix_cell(a: &LocalCellArgs) -> Result<Outcome, String> {
    use actix::Actor as _;
    let a = a.clone();
    actix_rt::System::new().block_on(async move {
        match a.workload {
            Workload::OneToOne | Workload::ManyToOne => {
                let (sink, done) = Sink::new(a.messages);
                let to = ActixSink(sink).start();
                stream(to, done, a.messages, a.senders)
                    .await
                    .map(Outcome::Measured)
            }
            Workload::Calls => calls(ActixServer.start(), a.messages, a.senders)
                .await
                .map(Outcome::Measured),
            Workload::Idle => Ok(Outcome::Idle(
                idle(
                    a.actors,
                    |started| async { ActixIdle(started).start() },
                    told,
                )
                .await,
            )),
        }
    })
}

// ---- ractor ----

/// ractor's receiving actor; its state is the sink.
struct RactorSink;

impl ractor::Actor for RactorSink {
    type Msg = Msg;
    type State = Sink;
    type Arguments = Sink;

    async fn pre_start(
        &self,
        _: ractor::ActorRef<Msg>,
        sink: Sink,
    ) -> Result<Sink, ractor::ActorProcessingErr> {
        Ok(sink)
    }

    async fn handle(
        &self,
        _: ractor::ActorRef<Msg>,
        m: Msg,
        sink: &mut Sink,
    ) -> Result<(), ractor::ActorProcessingErr> {
        sink.take(m);
        Ok(())
    }
}

/// A call to ractor's server.
struct RactorAsk(u64, ractor::RpcReplyPort<u64>);

struct RactorServer;

impl ractor::Actor for RactorServer {
    type Msg = RactorAsk;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ractor::ActorRef<RactorAsk>,
        _: (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ractor::ActorRef<RactorAsk>,
        RactorAsk(x, reply): RactorAsk,
        _: &mut (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        let _ = reply.send(x);
        Ok(())
    }
}

struct RactorIdle;

impl ractor::Actor for RactorIdle {
    type Msg = Msg;
    type State = Arc<Started>;
    type Arguments = Arc<Started>;

    async fn pre_start(
        &self,
        _: ractor::ActorRef<Msg>,
        started: Arc<Started>,
    ) -> Result<Arc<Started>, ractor::ActorProcessingErr> {
        Ok(started)
    }

    async fn handle(
        &self,
        _: ractor::ActorRef<Msg>,
        _: Msg,
        started: &mut Arc<Started>,
    ) -> Result<(), ractor::ActorProcessingErr> {
        started.one();
        Ok(())
    }
}

impl Tell for ractor::ActorRef<Msg> {
    async fn tell(&self, m: Msg) {
        let _ = self.cast(m);
    }
}

impl Ask for ractor::ActorRef<RactorAsk> {
    async fn ask(&self, x: u64) -> u64 {
        match self.call(|reply| RactorAsk(x, reply), None).await {
            Ok(ractor::rpc::CallResult::Success(v)) => v,
            _ => u64::MAX,
        }
    }
}

/// Runs a ractor cell.
pub async fn ractor_cell(a: &LocalCellArgs) -> Result<Outcome, String> {
    match a.workload {
        Workload::OneToOne | Workload::ManyToOne => {
            let (sink, done) = Sink::new(a.messages);
            let (to, _) = ractor::Actor::spawn(None, RactorSink, sink)
                .await
                .map_err(|e| e.to_string())?;
            stream(to, done, a.messages, a.senders)
                .await
                .map(Outcome::Measured)
        }
        Workload::Calls => {
            let (server, _) = ractor::Actor::spawn(None, RactorServer, ())
                .await
                .map_err(|e| e.to_string())?;
            calls(server, a.messages, a.senders)
                .await
                .map(Outcome::Measured)
        }
        Workload::Idle => {
            // A failed spawn still counts as started (so the wait ends) and fails the cell.
            let failed = std::cell::RefCell::new(None);
            let per = idle(
                a.actors,
                |started| {
                    let failed = &failed;
                    async move {
                        match ractor::Actor::spawn(None, RactorIdle, started.clone()).await {
                            Ok((r, _)) => Some(r),
                            Err(e) => {
                                started.one();
                                failed.borrow_mut().get_or_insert(e.to_string());
                                None
                            }
                        }
                    }
                },
                |r| async move {
                    if let Some(r) = &r {
                        r.tell(stamp(1)).await;
                    }
                    r
                },
            )
            .await;
            match failed.into_inner() {
                Some(e) => Err(format!("ractor spawn: {e}")),
                None => Ok(Outcome::Idle(per)),
            }
        }
    }
}

// ---- kameo ----

/// kameo's receiving actor.
#[derive(kameo::Actor)]
struct KameoSink(Sink);

impl kameo::message::Message<Msg> for KameoSink {
    type Reply = ();
    async fn handle(&mut self, m: Msg, _: &mut kameo::message::Context<Self, ()>) {
        self.0.take(m);
    }
}

/// A call to kameo's server.
struct KameoAsk(u64);

#[derive(kameo::Actor)]
struct KameoServer;

impl kameo::message::Message<KameoAsk> for KameoServer {
    type Reply = u64;
    async fn handle(&mut self, m: KameoAsk, _: &mut kameo::message::Context<Self, u64>) -> u64 {
        m.0
    }
}

#[derive(kameo::Actor)]
struct KameoIdle(Arc<Started>);

impl kameo::message::Message<Msg> for KameoIdle {
    type Reply = ();
    async fn handle(&mut self, _: Msg, _: &mut kameo::message::Context<Self, ()>) {
        self.0.one();
    }
}

impl<A> Tell for kameo::actor::ActorRef<A>
where
    A: kameo::Actor + kameo::message::Message<Msg, Reply = ()>,
{
    async fn tell(&self, m: Msg) {
        let _ = self.tell(m).await;
    }
}

impl Ask for kameo::actor::ActorRef<KameoServer> {
    async fn ask(&self, x: u64) -> u64 {
        self.ask(KameoAsk(x)).await.unwrap_or(u64::MAX)
    }
}

/// Runs a kameo cell.
pub async fn kameo_cell(a: &LocalCellArgs) -> Result<Outcome, String> {
    use kameo::actor::Spawn as _;
    match a.workload {
        Workload::OneToOne | Workload::ManyToOne => {
            let (sink, done) = Sink::new(a.messages);
            let to = KameoSink::spawn(KameoSink(sink));
            stream(to, done, a.messages, a.senders)
                .await
                .map(Outcome::Measured)
        }
        Workload::Calls => calls(KameoServer::spawn(KameoServer), a.messages, a.senders)
            .await
            .map(Outcome::Measured),
        Workload::Idle => Ok(Outcome::Idle(
            idle(
                a.actors,
                |started| async { KameoIdle::spawn(KameoIdle(started)) },
                told,
            )
            .await,
        )),
    }
}
