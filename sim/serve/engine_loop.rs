//! The serving loop: the engine's scheduler, block-manager and worker actors (the very
//! [`ActorEngine`] `sim run` drives) stepped by a wall clock instead of the event heap.
//!
//! In: [`Cmd`]s from the HTTP handlers (a submitted request, an abort). Out: per request,
//! [`Event`]s on its own channel (its id, its tokens as each step samples them, its
//! record); per step, a row of `steps.csv`; per request, a row of `requests.csv`; the
//! live [`Metrics`]. The loop steps while work exists and sleeps on its command channel
//! when none does.
//!
//! Time: real backends (`cpu`, `cuda`) run each step and commit it at the wall-clock time
//! it ended. The cost model (`model`) commits each step at its start plus the predicted
//! duration and sleeps until then on the wall clock, divided by the time scale: so tokens
//! reach clients when an engine on the simulated GPU would send them (`--time-scale 10`:
//! ten times sooner). Request arrivals are the times the HTTP handler received them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use analysis::RunCollector;
use engine::plan::{StepOutcome, TokenLogprobs, WorkKind};
use engine::record::RequestRecord;
use engine::request::{FinishReason, Nanos, Request, SamplingParams, SeqId};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc::{error::TryRecvError, UnboundedReceiver, UnboundedSender};

use super::metrics::Metrics;
use super::stop::{OutputText, StopStrings};
use crate::driver::{step_record, ActorEngine, DriverError, EngineHandle, EngineParts};

/// A request as a handler hands it to the loop.
#[derive(Debug)]
pub struct Submission {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens per choice.
    pub max_tokens: u32,
    /// Generate to `max_tokens` whatever is sampled.
    pub ignore_eos: bool,
    /// Neither end-of-sequence nor a stop token id ends a choice before this many tokens
    /// (nor can be drawn before).
    pub min_tokens: u32,
    /// Token ids that end a choice, as end-of-sequence does.
    pub stop_token_ids: Vec<u32>,
    /// Stop strings, which end a choice in the step whose tokens complete one.
    pub stop: Option<StopStrings>,
    /// Choices (parallel sampling).
    pub n: u32,
    /// How tokens are drawn.
    pub sampling: SamplingParams,
    /// When the handler received the request (its arrival).
    pub received: Instant,
    /// Where the request's events go.
    pub events: UnboundedSender<Event>,
    /// Held until the request ends in the engine (the server's slot for it, so that
    /// requests aborted but not yet ended still count against its limit).
    pub hold: Box<dyn std::any::Any + Send>,
}

/// What a handler asks of the loop.
#[derive(Debug)]
pub enum Cmd {
    /// A new request.
    Submit(Box<Submission>),
    /// End this request: its client went away (`Abort`) or a stop string matched
    /// (`Stop`).
    Abort(SeqId, FinishReason),
    /// End one choice of a parallel-sampling request (a stop string matched in its text
    /// while other choices go on): its sequence ends at its next step, its blocks freed.
    StopChoice(SeqId, u32),
    /// The server is stopping: abort every request, refuse new ones.
    Shutdown,
}

/// What the loop tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// The request's id (first event).
    Started(SeqId),
    /// Tokens of choice `index` from one step; `finished` when they end it.
    Tokens {
        /// Choice.
        index: u32,
        /// Token ids, in order.
        ids: Vec<u32>,
        /// Their log-probabilities, one each, when the request asked (else empty).
        logprobs: Vec<TokenLogprobs>,
        /// Why the choice ended with these tokens, if it did.
        finished: Option<FinishReason>,
        /// Why the scheduler ended it, if it did: `finished` but for a stop string found
        /// by the loop (a last token that is a stop token id is dropped from the text only
        /// when the scheduler stopped on it, as the loop's own search did).
        scheduler: Option<FinishReason>,
    },
    /// The request ended (every choice): its record.
    Done(RequestRecord),
    /// The engine failed; the request will not finish.
    Failed(String),
}

/// Engine time from the wall clock: nanoseconds since the server started, times the
/// time scale (1 for real backends).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
    scale: f64,
}

impl Clock {
    /// A clock starting now, running `scale` times faster than the wall clock.
    pub fn new(scale: f64) -> Self {
        Clock {
            origin: Instant::now(),
            scale,
        }
    }

    /// Engine time of a wall-clock instant.
    pub fn at(&self, t: Instant) -> Nanos {
        (t.saturating_duration_since(self.origin).as_nanos() as f64 * self.scale) as Nanos
    }

    /// Engine time now.
    pub fn now(&self) -> Nanos {
        self.at(Instant::now())
    }

    /// The wall-clock instant of an engine time.
    fn wall(&self, t: Nanos) -> Instant {
        self.origin + Duration::from_nanos((t as f64 / self.scale) as u64)
    }
}

/// Sleeps until `deadline`. Tokio's timer wheel ticks by the millisecond and rounds a
/// deadline up to its next tick: at a high time scale, where a simulated step lasts less
/// than a millisecond of wall clock, every step would end late and the steps behind it,
/// already due, would go out at once (a benchmark client then measures inter-token
/// latencies of 0 and 1 ms instead of the steps'). So the timer waits for all but the
/// last millisecond and the thread's own sleep (tens of microseconds late on Linux) for
/// the rest: the engine's thread runs nothing else while a step is under way.
async fn sleep_until(deadline: Instant) {
    const TICK: Duration = Duration::from_millis(1);
    let now = Instant::now();
    if deadline > now + 2 * TICK {
        tokio::time::sleep_until((deadline - TICK).into()).await;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

/// A live request's delivery state: each choice's tokens so far and whether it ended.
struct Live {
    events: UnboundedSender<Event>,
    /// Dropped with the request (see [`Submission::hold`]), or as soon as the scheduler
    /// has ended all its choices, before their last tokens go out: a client that sends
    /// its next request on the answer must find the slot free.
    hold: Option<Box<dyn std::any::Any + Send>>,
    /// Its handler went away and the engine was told to end it.
    aborted: bool,
    max_tokens: u32,
    ignore_eos: bool,
    min_tokens: u32,
    stop_token_ids: Vec<u32>,
    emitted: Vec<u32>,
    ended: Vec<bool>,
    /// The stop strings and each choice's text, searched as the handler searches it.
    stop: Option<(StopStrings, Vec<OutputText>)>,
    /// The end of the step in which stop strings had ended every choice.
    stopped_at: Option<Nanos>,
}

impl Live {
    /// Sends the tokens of choice `index`, cut where the scheduler ends the choice
    /// (`max_tokens`, or end-of-sequence or a stop token id once `min_tokens` are out), as
    /// `append_token` does; true when a stop string ends it here (the caller then ends it
    /// in the engine, before the next step).
    fn deliver(
        &mut self,
        index: u32,
        tokens: &[u32],
        mut logprobs: Vec<TokenLogprobs>,
        eos: Option<u32>,
    ) -> bool {
        let i = index as usize;
        if i >= self.ended.len() || self.ended[i] {
            return false;
        }
        let mut ids = Vec::with_capacity(tokens.len());
        let mut finished = None;
        for &t in tokens {
            ids.push(t);
            self.emitted[i] += 1;
            if self.emitted[i] >= self.max_tokens {
                finished = Some(FinishReason::Length);
            } else if engine::request::stops_at(
                t,
                self.emitted[i],
                eos,
                self.ignore_eos,
                self.min_tokens,
                &self.stop_token_ids,
            ) {
                finished = Some(FinishReason::Stop);
            }
            if finished.is_some() {
                self.ended[i] = true;
                break;
            }
        }
        let mut stopped = false;
        let scheduler = finished;
        // (Not for a request being aborted: its client is gone, or the server is stopping.)
        let aborted = self.aborted;
        if let Some((stop, outs)) = self.stop.as_mut().filter(|_| !aborted) {
            // The handler's search on the same text (a stop token id that ends the choice
            // stays out of it unless asked for): the same string found in the same step.
            let o = &mut outs[i];
            o.ids.extend_from_slice(&ids);
            let mut end = o.ids.len();
            if finished == Some(FinishReason::Stop) && !stop.include_stop {
                let t = ids.last().copied();
                let is_eos = !self.ignore_eos && t.is_some() && t == eos;
                if !is_eos && t.is_some_and(|t| self.stop_token_ids.contains(&t)) {
                    end -= 1;
                }
            }
            o.advance(&*stop.decode, end, finished.is_some());
            if o.find_stop(&stop.strings, self.min_tokens).is_some() {
                stopped = true;
                finished = Some(FinishReason::Stop);
                self.ended[i] = true;
            }
        }
        if self.ended.iter().all(|&e| e) {
            // The scheduler ended the request in this step, its blocks freed there (or a
            // stop string did, and the loop ends it before the next step).
            self.hold = None;
        }
        logprobs.truncate(ids.len());
        // A handler that went away aborts its request; its tokens go nowhere meanwhile.
        let _ = self.events.send(Event::Tokens {
            index,
            ids,
            logprobs,
            finished,
            scheduler,
        });
        stopped
    }
}

/// What the loop needs besides its engine.
pub struct LoopParts {
    /// The engine's cores (the loop starts their actors).
    pub parts: EngineParts,
    /// Commands from the handlers.
    pub cmds: UnboundedReceiver<Cmd>,
    /// Engine time.
    pub clock: Clock,
    /// Whether steps are predicted (the cost model: wait for their end) or measured.
    pub simulated: bool,
    /// End-of-sequence id of the model.
    pub eos: Option<u32>,
    /// Live metrics, read by `/metrics`.
    pub metrics: Arc<Mutex<Metrics>>,
    /// Records of every request and step.
    pub collector: RunCollector,
}

/// What the loop leaves when its command channel closes and its last request ends.
pub struct LoopEnd {
    /// The records.
    pub collector: RunCollector,
    /// KV pool size.
    pub pool_blocks: u32,
    /// Blocks still in use at the end (a leak if not 0).
    pub blocks_in_use: u32,
    /// Prefix-cache evictions.
    pub evictions: u64,
    /// Engine time of the last event.
    pub end: Nanos,
}

/// Runs the loop on the current actix system until the command channel closes and every
/// live request has ended (the ones still running when it closes are aborted).
pub async fn run(lp: LoopParts) -> Result<LoopEnd, DriverError> {
    let LoopParts {
        parts,
        mut cmds,
        clock,
        simulated,
        eos,
        metrics,
        mut collector,
    } = lp;
    let mut eng = ActorEngine::start(parts.scheduler, parts.block_manager, parts.backend);
    let block_size = eng.block_size().await?;
    let (_, pool_blocks, _) = eng.pool_usage().await?;
    if !simulated {
        warm_up(&mut eng).await?;
    }
    let mut live: FxHashMap<SeqId, Live> = FxHashMap::default();
    let mut next_id: SeqId = 0;
    let mut closed = false;
    // Engine time never goes back (a step committed at its predicted end may run ahead of
    // the wall clock when the server cannot keep up with the time scale).
    let mut last: Nanos = 0;
    // The latest arrival taken in, and whether the engine ran a step last time round: a
    // simulated engine with work steps on from its last step's end, however late the wall
    // clock (the timer's granularity, this process's own cost), and requests that arrive
    // meanwhile arrive at that engine time; so a high time scale slows delivery instead of
    // inserting idle time the engine never had.
    let mut latest: Nanos = 0;
    let mut busy = false;
    let mut engine_now: Nanos = Nanos::MAX;
    // The loop's state a command changes, borrowed for one command.
    macro_rules! state {
        () => {
            State {
                eng: &mut eng,
                live: &mut live,
                next_id: &mut next_id,
                closed: &mut closed,
                collector: &mut collector,
                latest: &mut latest,
                engine_now,
            }
        };
    }
    let result = async {
        loop {
            // Take every command waiting, without blocking.
            loop {
                match cmds.try_recv() {
                    Ok(cmd) => state!().handle(cmd, &clock, &metrics).await?,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        state!().handle(Cmd::Shutdown, &clock, &metrics).await?;
                        break;
                    }
                }
            }
            if closed && live.is_empty() {
                break;
            }
            // Requests whose handler went away without aborting them (a client that hung up
            // before its request started): ended now. After the commands, so that a
            // handler's own last word (a stop string's end) comes first.
            let gone: Vec<SeqId> = live
                .iter()
                .filter(|(_, l)| !l.aborted && l.events.is_closed())
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                let at = clock.now().max(last).min(engine_now);
                state!()
                    .abort(id, FinishReason::Abort, at, &metrics)
                    .await?;
            }
            let now = if simulated && busy {
                last.max(latest)
            } else {
                clock.now().max(last).max(latest)
            };
            engine_now = if simulated && busy { now } else { Nanos::MAX };
            let mut planned = eng.plan(now).await?;
            // Preemptions without work changed the pool: record them and plan again.
            while let Some(p) = planned.as_ref().filter(|p| {
                p.plan.is_empty() && !p.plan.has_transfers() && !p.plan.preempted.is_empty()
            }) {
                collector.record_step(&step_record(
                    p,
                    &StepOutcome::default(),
                    pool_blocks,
                    block_size,
                ))?;
                planned = eng.plan(now).await?;
            }
            let idle = planned
                .as_ref()
                .is_none_or(|p| p.plan.is_empty() && !p.plan.has_transfers());
            busy = !idle;
            if idle {
                let (used, _, _) = eng.pool_usage().await?;
                let load = eng.load().await?;
                if let Ok(mut m) = metrics.lock() {
                    m.set_state(
                        u64::from(load.running),
                        u64::from(load.waiting),
                        used,
                        pool_blocks,
                    );
                }
                if closed {
                    // Nothing can run and nothing more comes: what is left never will.
                    break;
                }
                let cmd = cmds.recv().await.unwrap_or(Cmd::Shutdown);
                state!().handle(cmd, &clock, &metrics).await?;
                continue;
            }
            let Some(planned) = planned else { continue };
            let record = step_record(&planned, &StepOutcome::default(), pool_blocks, block_size);
            let (plan, outcome) = eng.execute(planned.plan).await?;
            let end = if simulated {
                let end = now + outcome.duration.max(1);
                sleep_until(clock.wall(end)).await;
                end
            } else {
                clock.now().max(now + 1)
            };
            last = end;
            let (mbu, mfu) = (outcome.mbu, outcome.mfu);
            // The step's tokens, per request and choice, before the commit moves them.
            let mut deliveries: Vec<(SeqId, u32, Vec<u32>, Vec<TokenLogprobs>)> = Vec::new();
            let mut sampled = outcome.sampled.iter().copied();
            let mut accepted = outcome.accepted.iter().copied();
            let mut logprobs = outcome.logprobs.iter();
            for w in &plan.work {
                let count = match w.kind {
                    WorkKind::Verify => accepted.next().unwrap_or(0) as usize + 1,
                    _ if w.sample => w.num_samples.max(1) as usize,
                    _ => 0,
                };
                let tokens: Vec<u32> = sampled.by_ref().take(count).collect();
                // (None: the work did not ask; an outcome without any: no work did.)
                let lps: Vec<TokenLogprobs> = logprobs
                    .by_ref()
                    .take(count)
                    .filter_map(Clone::clone)
                    .collect();
                if tokens.is_empty() {
                    continue;
                }
                let request = w.seq & ((1 << 40) - 1);
                let index = (w.seq >> 40) as u32;
                if w.kind != WorkKind::Verify && tokens.len() > 1 {
                    // A parallel-sampling prompt's first tokens: one per choice.
                    for (j, &t) in tokens.iter().enumerate() {
                        let lp = lps.get(j).cloned().into_iter().collect();
                        deliveries.push((request, j as u32, vec![t], lp));
                    }
                } else {
                    deliveries.push((request, index, tokens, lps));
                }
            }
            let (result, gaps) = eng.commit(plan, outcome, end).await?;
            let mut stopped: Vec<(SeqId, u32)> = Vec::new();
            for (request, index, tokens, lps) in deliveries {
                if let Some(l) = live.get_mut(&request) {
                    if l.deliver(index, &tokens, lps, eos) {
                        stopped.push((request, index));
                    }
                }
            }
            collector.record_itl(&gaps);
            // The records first: a client that sees the pool empty sees its slots free.
            for mut rec in result.finished {
                // Ended by the scheduler in the step whose text completed a stop string:
                // the client was told `stop`, and so are the records (vLLM's front end).
                let by_string = stopped.iter().any(|&(r, _)| r == rec.request_id);
                if by_string && rec.finish_reason != FinishReason::Abort {
                    rec.finish_reason = FinishReason::Stop;
                }
                finish(rec, &mut live, &mut collector, &metrics)?;
            }
            // Choices a stop string ended while the scheduler would go on: ended in the
            // engine before its next step, so their records hold the tokens the client got.
            for (request, index) in stopped {
                let Some(l) = live.get_mut(&request) else {
                    continue;
                };
                if l.ended.iter().all(|&e| e) {
                    l.stopped_at = Some(end);
                    state!()
                        .abort(request, FinishReason::Stop, end, &metrics)
                        .await?;
                } else if !l.aborted {
                    eng.abort_choice(request, index, FinishReason::Stop).await?;
                }
            }
            let (used, _, _) = eng.pool_usage().await?;
            if let Ok(mut m) = metrics.lock() {
                m.observe_itl(&gaps);
                m.set_state(
                    u64::from(planned.num_running),
                    u64::from(planned.num_waiting),
                    used,
                    pool_blocks,
                );
            }
            // A measured step lasts until the engine can plan the next: the commit and the
            // delivery of its tokens count (a fit to these steps then prices them too).
            let done = if simulated { end } else { clock.now().max(end) };
            last = done;
            collector.record_step(&engine::record::StepRecord {
                duration_ns: done - now,
                mbu,
                mfu,
                ..record
            })?;
        }
        Ok::<(), DriverError>(())
    }
    .await;
    if let Err(e) = result {
        for l in live.values() {
            let _ = l.events.send(Event::Failed(e.to_string()));
        }
        return Err(e);
    }
    let (blocks_in_use, _, evictions) = eng.pool_usage().await?;
    Ok(LoopEnd {
        collector,
        pool_blocks,
        blocks_in_use,
        evictions,
        end: last.max(clock.now()),
    })
}

/// Id of the warm-up request (above any served request's, below the 2^40 of child ids).
const WARM_UP_ID: SeqId = (1 << 40) - 1;

/// Runs one short request through a real runtime before serving, unrecorded (vLLM's
/// profile run and warm-up): the first served request then does not pay for the weights
/// being paged in and the threads started (on the CPU runtime, the first step took 3-4x
/// its later cost).
async fn warm_up(eng: &mut ActorEngine) -> Result<(), DriverError> {
    let prompt: Vec<u32> = (0..64).map(|i| 1 + i % 100).collect();
    if eng
        .arrive(Request::new(WARM_UP_ID, 0, 0, 4).with_tokens(prompt), 0)
        .await?
        .is_some()
    {
        return Ok(());
    }
    for _ in 0..64 {
        let Some(planned) = eng.plan(0).await? else {
            break;
        };
        if planned.plan.is_empty() && !planned.plan.has_transfers() {
            break;
        }
        let (plan, outcome) = eng.execute(planned.plan).await?;
        let (result, _) = eng.commit(plan, outcome, 0).await?;
        if !result.finished.is_empty() {
            break;
        }
    }
    Ok(())
}

/// A request ended: its record kept, counted, and sent to its handler.
fn finish(
    mut rec: RequestRecord,
    live: &mut FxHashMap<SeqId, Live>,
    collector: &mut RunCollector,
    metrics: &Arc<Mutex<Metrics>>,
) -> Result<(), DriverError> {
    if let Some(l) = live.get(&rec.request_id).filter(|l| l.stop.is_some()) {
        // A request with stop strings: a choice that one ended stops for its client with
        // the step that completed the string, but the scheduler, told before its next step,
        // ends the sequence in that step (as vLLM's engine core often runs one more step
        // before its front end's abort lands). The record counts what the client was sent,
        // as vLLM's front end does, and ends when the last string did.
        if matches!(rec.finish_reason, FinishReason::Stop | FinishReason::Length) {
            rec.output_len = l.emitted.iter().copied().max().unwrap_or(0);
            rec.generated_tokens = l.emitted.iter().sum();
        }
        if let Some(at) = l.stopped_at {
            rec.finish_ns = at.min(rec.finish_ns).max(rec.arrival_ns);
        }
    }
    collector.record_request(&rec)?;
    if let Ok(mut m) = metrics.lock() {
        m.observe(&rec);
    }
    if let Some(l) = live.remove(&rec.request_id) {
        let _ = l.events.send(Event::Done(rec));
    }
    Ok(())
}

/// The loop's state a command changes.
struct State<'a> {
    eng: &'a mut ActorEngine,
    live: &'a mut FxHashMap<SeqId, Live>,
    next_id: &'a mut SeqId,
    closed: &'a mut bool,
    collector: &'a mut RunCollector,
    latest: &'a mut Nanos,
    /// A busy simulated engine's time: arrivals are taken at it, not after it.
    engine_now: Nanos,
}

impl State<'_> {
    /// Ends a live request (nothing when it already ended): at once if it was still
    /// queued, else at its next step.
    async fn abort(
        &mut self,
        id: SeqId,
        reason: FinishReason,
        now: Nanos,
        metrics: &Arc<Mutex<Metrics>>,
    ) -> Result<(), DriverError> {
        let Some(l) = self.live.get_mut(&id) else {
            return Ok(());
        };
        if l.aborted {
            return Ok(());
        }
        l.aborted = true;
        if let Some(rec) = self.eng.abort(id, reason, now).await? {
            finish(rec, self.live, self.collector, metrics)?;
        }
        Ok(())
    }

    /// Applies one command.
    async fn handle(
        &mut self,
        cmd: Cmd,
        clock: &Clock,
        metrics: &Arc<Mutex<Metrics>>,
    ) -> Result<(), DriverError> {
        match cmd {
            Cmd::Abort(id, reason) => {
                let now = clock.now().min(self.engine_now);
                self.abort(id, reason, now, metrics).await?;
            }
            Cmd::StopChoice(id, index) => {
                // (Nothing when the loop ended it already, on the same stop string.)
                let ended = |l: &Live| l.ended.get(index as usize).copied().unwrap_or(true);
                if self.live.get(&id).is_some_and(|l| !l.aborted && !ended(l)) {
                    self.eng.abort_choice(id, index, FinishReason::Stop).await?;
                }
            }
            Cmd::Shutdown => {
                if !*self.closed {
                    *self.closed = true;
                    let now = clock.now().min(self.engine_now);
                    let ids: Vec<SeqId> = self.live.keys().copied().collect();
                    for id in ids {
                        self.abort(id, FinishReason::Abort, now, metrics).await?;
                    }
                }
            }
            Cmd::Submit(s) => {
                if *self.closed {
                    let _ = s
                        .events
                        .send(Event::Failed("the server is shutting down".into()));
                    return Ok(());
                }
                let id = *self.next_id;
                // A handler that already went away gets nothing started.
                if s.events.send(Event::Started(id)).is_err() {
                    return Ok(());
                }
                *self.next_id += 1;
                let arrival = clock.at(s.received).min(self.engine_now).max(*self.latest);
                let mut req = Request::new(id, arrival, 0, s.max_tokens).with_tokens(s.prompt);
                req.ignore_eos = s.ignore_eos;
                req.min_tokens = s.min_tokens;
                req.stop_token_ids = s.stop_token_ids.clone();
                req.n = s.n;
                req.sampling = s.sampling;
                let n = s.n as usize;
                self.live.insert(
                    id,
                    Live {
                        events: s.events,
                        hold: Some(s.hold),
                        aborted: false,
                        max_tokens: s.max_tokens,
                        ignore_eos: s.ignore_eos,
                        min_tokens: s.min_tokens,
                        stop_token_ids: s.stop_token_ids,
                        emitted: vec![0; n],
                        ended: vec![false; n],
                        stop: s.stop.map(|st| {
                            let outs = (0..n).map(|_| OutputText::default()).collect();
                            (st, outs)
                        }),
                        stopped_at: None,
                    },
                );
                *self.latest = (*self.latest).max(arrival);
                if let Some(rejected) = self.eng.arrive(req, arrival).await? {
                    finish(rejected, self.live, self.collector, metrics)?;
                }
            }
        }
        Ok(())
    }
}
