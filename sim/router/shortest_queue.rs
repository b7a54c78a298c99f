//! Join the shortest queue by tokens: the replica with the fewest prompt + output tokens
//! in flight, by the router's own count (the load an SGLang-router-style balancer tracks),
//! so one long prompt weighs as much as many short ones; ties at random.

use engine::request::Request;
use rand_chacha::ChaCha8Rng;

use super::{argmin_random, Choice, ReplicaView, RoutingPolicy};

/// Fewest tokens in flight.
#[derive(Debug, Default)]
pub struct ShortestQueue;

impl RoutingPolicy for ShortestQueue {
    fn choose(&mut self, _: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice {
        Choice::of(argmin_random(views.iter().map(|v| v.outstanding_tokens), rng).unwrap_or(0))
    }
}
