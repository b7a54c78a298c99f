//! Round-robin: replicas in turn, whatever their load (Vidur's default global scheduler,
//! and what a Kubernetes Service does with long-lived connections spread evenly).

use engine::request::Request;
use rand_chacha::ChaCha8Rng;

use super::{Choice, ReplicaView, RoutingPolicy};

/// The next replica after the last one chosen.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoutingPolicy for RoundRobin {
    fn choose(&mut self, _: &Request, views: &[ReplicaView], _: &mut ChaCha8Rng) -> Choice {
        let r = self.next % views.len();
        self.next = r + 1;
        Choice::of(r)
    }
}
