//! Session affinity: every turn of a conversation goes where its first turn went (a sticky
//! session header, llm-d's session-affinity scorer at full weight), so the replica that
//! holds its history's KV serves it. A request without a session, or a session's first
//! turn, goes to the least outstanding replica. The table remembers the most recent
//! [`MAX_SESSIONS`] sessions (a bounded LRU, so memory does not grow with the trace).

use engine::request::Request;
use lru::LruCache;
use rand_chacha::ChaCha8Rng;

use super::{argmin_random, Choice, ReplicaView, RoutingPolicy};

/// Sessions remembered.
pub const MAX_SESSIONS: usize = 1 << 18;

/// Session -> replica.
pub struct SessionAffinity {
    sessions: LruCache<u64, usize>,
}

impl Default for SessionAffinity {
    fn default() -> Self {
        SessionAffinity {
            // Grown as sessions come, bounded below by hand.
            sessions: LruCache::unbounded(),
        }
    }
}

impl RoutingPolicy for SessionAffinity {
    fn choose(&mut self, req: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice {
        if req.session != 0 {
            if let Some(&r) = self.sessions.get(&req.session) {
                if r < views.len() {
                    return Choice::of(r);
                }
            }
        }
        let r = argmin_random(views.iter().map(|v| v.outstanding), rng).unwrap_or(0);
        if req.session != 0 {
            self.sessions.push(req.session, r);
            if self.sessions.len() > MAX_SESSIONS {
                self.sessions.pop_lru();
            }
        }
        Choice::of(r)
    }
}
