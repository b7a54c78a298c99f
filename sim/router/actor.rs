//! The router's actix shell: one message per decision, per batch of ended requests and per
//! refresh, each handled by the [`Router`] core. It runs on the driver's arbiter with the
//! replicas' actors, so message order, and the results, are deterministic.

use actix::prelude::*;
use engine::request::{Nanos, Request, SeqId};

use super::{Decision, Load, Router, RouterError};

/// Owns the router core.
pub struct RouterActor {
    core: Router,
}

impl RouterActor {
    /// Wraps a router.
    pub fn new(core: Router) -> Self {
        RouterActor { core }
    }
}

impl Actor for RouterActor {
    type Context = Context<Self>;
}

/// Route a request at a time; answers the request back with the decision.
#[derive(Message)]
#[rtype(result = "Result<(Request, Decision), RouterError>")]
pub struct Route(pub Request, pub Nanos);

impl Handler<Route> for RouterActor {
    type Result = Result<(Request, Decision), RouterError>;
    fn handle(&mut self, Route(req, now): Route, _: &mut Context<Self>) -> Self::Result {
        let d = self.core.route(&req, now)?;
        Ok((req, d))
    }
}

/// These requests ended on this replica.
#[derive(Message)]
#[rtype(result = "Result<(), RouterError>")]
pub struct Ended(pub Vec<SeqId>, pub usize);

impl Handler<Ended> for RouterActor {
    type Result = Result<(), RouterError>;
    fn handle(&mut self, Ended(ids, replica): Ended, _: &mut Context<Self>) -> Self::Result {
        ids.into_iter()
            .try_for_each(|id| self.core.ended(id, replica))
    }
}

/// A disaggregated request's prefill ended on replica `.1`; its decode is on `.2`.
#[derive(Message)]
#[rtype(result = "Result<(), RouterError>")]
pub struct Handoff(pub SeqId, pub usize, pub usize);

impl Handler<Handoff> for RouterActor {
    type Result = Result<(), RouterError>;
    fn handle(&mut self, Handoff(id, from, to): Handoff, _: &mut Context<Self>) -> Self::Result {
        self.core.handoff(id, from, to)
    }
}

/// The replicas' exported loads at a time; answers the requests still in flight.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Refresh(pub Vec<Load>, pub Nanos);

impl Handler<Refresh> for RouterActor {
    type Result = usize;
    fn handle(&mut self, Refresh(loads, now): Refresh, _: &mut Context<Self>) -> usize {
        self.core.refresh(&loads, now);
        self.core.in_flight()
    }
}
