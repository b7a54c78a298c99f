//! Random: each request to a replica drawn uniformly, whatever its load (Vidur's `random`
//! global scheduler). SGLang's prefill servers under attention data parallelism place a
//! disaggregated request on rank `bootstrap_room % dp`, and the room is a random 63-bit
//! number from the router (its mini load balancer's and Dynamo's `_generate_bootstrap_room`),
//! so their ranks are chosen this way.

use engine::request::Request;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Choice, ReplicaView, RoutingPolicy};

/// A replica drawn uniformly.
#[derive(Debug, Default)]
pub struct Random;

impl RoutingPolicy for Random {
    fn choose(&mut self, _: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice {
        Choice::of(rng.random_range(0..views.len()))
    }
}
