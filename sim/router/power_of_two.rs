//! Power of two choices (Mitzenmacher): two distinct replicas drawn at random, the one with
//! fewer requests in flight wins (the first drawn on a tie). Nearly as even as
//! least-outstanding while reading only two replicas' counts.

use engine::request::Request;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Choice, ReplicaView, RoutingPolicy};

/// The lighter of two random replicas.
#[derive(Debug, Default)]
pub struct PowerOfTwo;

impl RoutingPolicy for PowerOfTwo {
    fn choose(&mut self, _: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice {
        let n = views.len();
        if n == 1 {
            return Choice::of(0);
        }
        let a = rng.random_range(0..n);
        // A second replica, distinct from the first, uniformly.
        let b = (a + rng.random_range(1..n)) % n;
        Choice::of(if views[b].outstanding < views[a].outstanding {
            b
        } else {
            a
        })
    }
}
