//! Least outstanding requests: the replica with the fewest requests sent and not yet ended,
//! by the router's own count (Vidur's `lor`, Envoy's least-request balancer); ties at random.

use engine::request::Request;
use rand_chacha::ChaCha8Rng;

use super::{argmin_random, Choice, ReplicaView, RoutingPolicy};

/// Fewest requests in flight.
#[derive(Debug, Default)]
pub struct LeastOutstanding;

impl RoutingPolicy for LeastOutstanding {
    fn choose(&mut self, _: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice {
        Choice::of(argmin_random(views.iter().map(|v| v.outstanding), rng).unwrap_or(0))
    }
}
