//! Running generations: a fixed number of worker threads (slots), each owning one request at a
//! time with a fresh sequence state (or its own kept one, where the runner keeps states,
//! rewound to empty or to the last conversation it kept where the request goes on from it),
//! fed from a bounded queue: a conversation's next request goes to the idle slot keeping it.
//! Past the bound a request is refused at once (503) rather than left waiting without end.
//! The workers share one backend; with one slot (what `serve --device cuda` uses) requests run
//! one after another in arrival order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use engine::logprobs::{token_logprob, TokenLogprob};
use engine::{Backend, EngineError, FinishReason, Flow, GenerateParams, Hooks};
use tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::constraint::Constraint;
use crate::metrics::Metrics;
use crate::{Device, Runner};

/// What a request asks the engine to do.
pub struct Job {
    pub prompt: Vec<u32>,
    /// How many of the prompt's first tokens a later request of the same conversation will
    /// start with (its messages so far, without the reply's opening): where the slot keeps
    /// its sequence, the state is saved there for that request to start from.
    pub history: Option<usize>,
    pub params: GenerateParams,
    pub constraint: Option<Box<dyn Constraint>>,
    /// `Some(n)`: report each token's log-probability and its `n` best alternatives.
    pub logprobs: Option<usize>,
    pub cancel: Arc<AtomicBool>,
    pub timeout: Duration,
    pub events: mpsc::UnboundedSender<Event>,
}

/// How generation ended, as the API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    /// `max_tokens`, the context limit or the request timeout.
    Length,
    Cancelled,
}

#[derive(Debug)]
pub enum Event {
    /// Text safe to show, with the log-probabilities of the tokens that produced it.
    Text(String, Vec<TokenLogprob>),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        /// Of those, the ones taken from the slot's kept conversation, not fed again.
        cached_tokens: usize,
        completion_tokens: usize,
        /// Log-probabilities not yet sent with text (e.g. of held-back stop-string tokens).
        logprobs: Vec<TokenLogprob>,
    },
    Failed(String),
}

struct Queue {
    jobs: Mutex<VecDeque<(Job, Instant)>>,
    ready: Condvar,
}

pub struct Scheduler {
    queue: Arc<Queue>,
    /// Requests accepted and not finished (running or queued).
    in_system: Arc<AtomicUsize>,
    capacity: usize,
    slots: usize,
    /// Set on shutdown: running generations end, queued ones are refused.
    closing: Arc<AtomicBool>,
    /// Bytes of sequence state held by each slot now.
    state_bytes: Arc<Vec<AtomicUsize>>,
    metrics: Arc<Metrics>,
}

/// Refusal reasons for [`Scheduler::submit`].
#[derive(Debug)]
pub enum Refused {
    Full,
    Closing,
}

impl Scheduler {
    pub fn start<B>(
        runner: Arc<Runner<B>>,
        tok: Arc<Tokenizer>,
        slots: usize,
        queue: usize,
        metrics: Arc<Metrics>,
    ) -> Scheduler
    where
        B: Backend + Send + Sync + 'static,
    {
        let slots = slots.max(1);
        let q = Arc::new(Queue {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        });
        let in_system = Arc::new(AtomicUsize::new(0));
        let closing = Arc::new(AtomicBool::new(false));
        let state_bytes: Arc<Vec<AtomicUsize>> =
            Arc::new((0..slots).map(|_| AtomicUsize::new(0)).collect());
        let marks: Arc<Marked> = Arc::new(Marked::new(slots));
        for slot in 0..slots {
            let (q, runner, tok, marks) = (q.clone(), runner.clone(), tok.clone(), marks.clone());
            let (in_system, closing, bytes, metrics) = (
                in_system.clone(),
                closing.clone(),
                state_bytes.clone(),
                metrics.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("niwaki-slot-{slot}"))
                .spawn(move || {
                    let mut kept = None;
                    loop {
                        let (job, enqueued) = {
                            let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
                            loop {
                                let picked = marks.pick(slot, &jobs);
                                if let Some(j) = picked.and_then(|i| jobs.remove(i)) {
                                    marks.set_idle(slot, false);
                                    // The jobs left to slots of their own may be others' now.
                                    if !jobs.is_empty() {
                                        q.ready.notify_all();
                                    }
                                    break j;
                                }
                                marks.set_idle(slot, true);
                                jobs = q.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
                            }
                        };
                        metrics.queue_depth.dec();
                        metrics.queue_wait.observe(enqueued.elapsed().as_secs_f64());
                        run_job(
                            &runner,
                            &tok,
                            job,
                            &closing,
                            &bytes[slot],
                            &metrics,
                            (&mut kept, &|tokens| {
                                // Idle from here for the queue's view, so that the
                                // conversation's next request, which may come as soon as the
                                // client hears the end, waits for this slot.
                                let _jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
                                marks.set_mark(slot, tokens);
                                marks.set_idle(slot, true);
                            }),
                        );
                        // A kept sequence holds its memory between requests: its longest
                        // cache (a cut cache keeps its room) and its checkpoints.
                        let held = kept.as_ref().map_or(0, |(_, m)| {
                            let checkpoints = 1 + usize::from(m.history.is_some());
                            runner.device.kept_bytes(m.peak, checkpoints)
                        });
                        bytes[slot].store(held, Ordering::Relaxed);
                        in_system.fetch_sub(1, Ordering::AcqRel);
                    }
                });
            if let Err(e) = spawned {
                eprintln!("could not start generation slot {slot}: {e}");
            }
        }
        Scheduler {
            queue: q,
            in_system,
            capacity: slots + queue,
            slots,
            closing,
            state_bytes,
            metrics,
        }
    }

    /// Queues a job, or refuses it when every slot and queue place is taken.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        if self.closing.load(Ordering::Acquire) {
            return Err(Refused::Closing);
        }
        let admitted = self
            .in_system
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if admitted.is_err() {
            return Err(Refused::Full);
        }
        self.metrics.queue_depth.inc();
        let mut jobs = self.queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.push_back((job, Instant::now()));
        drop(jobs);
        // Every idle slot looks: the one keeping the job's conversation takes it.
        self.queue.ready.notify_all();
        Ok(())
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn in_flight(&self) -> usize {
        self.in_system.load(Ordering::Acquire)
    }

    pub fn state_bytes(&self) -> usize {
        self.state_bytes
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// Ends running generations (their clients get what was generated, or an error) and
    /// refuses queued and new ones.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let mut jobs = self.queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
        for (job, _) in jobs.drain(..) {
            let _ = job.events.send(Event::Failed(
                "the server is shutting down; the request was not started".into(),
            ));
            self.metrics.queue_depth.dec();
            self.in_system.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The per-token side of one generation.
struct JobHooks<'a> {
    events: mpsc::UnboundedSender<Event>,
    constraint: Option<Box<dyn Constraint>>,
    logprobs: Option<usize>,
    cancel: Arc<AtomicBool>,
    deadline: Instant,
    closing: &'a AtomicBool,
    pending: Vec<TokenLogprob>,
    timed_out: bool,
    constraint_error: Option<String>,
    state_bytes: &'a AtomicUsize,
    device: &'a Device,
    prompt_tokens: usize,
    generated: usize,
    metrics: &'a Metrics,
    last_token: Instant,
    first: bool,
    started: Instant,
}

impl Hooks for JobHooks<'_> {
    fn on_text(&mut self, piece: &str) -> Flow {
        let lp = std::mem::take(&mut self.pending);
        match self.events.send(Event::Text(piece.to_string(), lp)) {
            Ok(()) => Flow::Continue,
            // The client went away.
            Err(_) => Flow::Stop,
        }
    }

    fn mask(&mut self, logits: &mut [f32]) -> engine::Result<()> {
        match &mut self.constraint {
            Some(c) => c.mask(logits).map_err(EngineError::Constraint),
            None => Ok(()),
        }
    }

    fn on_token(&mut self, id: u32, logits: &[f32]) -> Flow {
        let now = Instant::now();
        if self.first {
            self.metrics
                .ttft
                .observe(now.duration_since(self.started).as_secs_f64());
            self.first = false;
        } else {
            self.metrics
                .itl
                .observe(now.duration_since(self.last_token).as_secs_f64());
        }
        self.last_token = now;
        self.generated += 1;
        self.state_bytes.store(
            self.device.state_bytes(self.prompt_tokens + self.generated),
            Ordering::Relaxed,
        );
        if let Some(n) = self.logprobs {
            self.pending.push(token_logprob(logits, id, n));
        }
        if let Some(c) = &mut self.constraint {
            if let Err(e) = c.commit(id) {
                self.constraint_error = Some(e);
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    fn wants_logits(&self) -> bool {
        self.constraint.is_some() || self.logprobs.is_some()
    }

    fn cancelled(&self) -> bool {
        if self.cancel.load(Ordering::Relaxed) || self.closing.load(Ordering::Relaxed) {
            return true;
        }
        Instant::now() >= self.deadline
    }
}

/// What a slot keeps between requests besides its sequence.
struct Marks<B: Backend> {
    /// The sequence's empty start.
    empty: B::Checkpoint,
    /// The last conversation so far that a request said where it ended: its tokens (shared
    /// with the slots' [`Marked`]) and the state saved after them.
    history: Option<(Arc<[u32]>, B::Checkpoint)>,
    /// The most tokens the sequence has held.
    peak: usize,
}

impl<B: Backend> Marks<B> {
    /// The kept conversation's tokens.
    fn tokens(&self) -> Option<Arc<[u32]>> {
        self.history.as_ref().map(|(t, _)| t.clone())
    }
}

/// Whether `prompt` goes on from a conversation of `tokens`: starts with them and has more.
fn goes_on_from(prompt: &[u32], tokens: &[u32]) -> bool {
    tokens.len() < prompt.len() && prompt.starts_with(tokens)
}

/// What every slot keeps of a conversation (its tokens) and whether it waits for a job: so
/// that a conversation's next request goes to the slot that can go on from it.
struct Marked {
    marks: Vec<Mutex<Option<Arc<[u32]>>>>,
    idle: Vec<AtomicBool>,
}

impl Marked {
    fn new(slots: usize) -> Marked {
        Marked {
            marks: (0..slots).map(|_| Mutex::new(None)).collect(),
            // Idle once its worker waits: a slot whose thread never started takes nothing.
            idle: (0..slots).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn set_idle(&self, slot: usize, idle: bool) {
        self.idle[slot].store(idle, Ordering::Release);
    }

    fn set_mark(&self, slot: usize, tokens: Option<Arc<[u32]>>) {
        *self.marks[slot].lock().unwrap_or_else(|p| p.into_inner()) = tokens;
    }

    /// Whether `slot` keeps a conversation that `prompt` goes on from.
    fn leads(&self, slot: usize, prompt: &[u32]) -> bool {
        let m = self.marks[slot].lock().unwrap_or_else(|p| p.into_inner());
        m.as_deref().is_some_and(|t| goes_on_from(prompt, t))
    }

    /// Whether `slot` keeps a conversation.
    fn marked(&self, slot: usize) -> bool {
        self.marks[slot]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The queued job `slot` takes (its index), in arrival order: the oldest that goes on from
    /// its own kept conversation or from none another idle slot keeps (that slot takes those);
    /// none where that job is of no conversation this slot keeps while this slot keeps one and
    /// another idle slot keeps none (that slot takes it, and this one's conversation stays).
    /// Called with the queue locked, so every job finds a taker: a job passed over is one an
    /// idle slot takes first.
    fn pick(&self, slot: usize, jobs: &VecDeque<(Job, Instant)>) -> Option<usize> {
        let others_idle =
            || (0..self.marks.len()).filter(|&s| s != slot && self.idle[s].load(Ordering::Acquire));
        let (i, mine) = jobs.iter().enumerate().find_map(|(i, (j, _))| {
            let mine = self.leads(slot, &j.prompt);
            (mine || !others_idle().any(|s| self.leads(s, &j.prompt))).then_some((i, mine))
        })?;
        if !mine && self.marked(slot) && others_idle().any(|s| !self.marked(s)) {
            return None;
        }
        Some(i)
    }
}

/// A slot's sequence kept between requests, and its marks.
type Kept<B> = Option<(<B as Backend>::State, Marks<B>)>;

/// The sequence a job starts from and how many of `prompt`'s first tokens it already holds:
/// the slot's kept one, rewound to the kept history where `prompt` starts with it and goes on
/// past it, else to empty; or a fresh one. With the marks the slot keeps after the job where
/// it keeps its sequence (the runner keeps states and the backend can rewind).
fn slot_state<B: Backend>(
    runner: &Runner<B>,
    kept: &mut Kept<B>,
    prompt: &[u32],
) -> engine::Result<(B::State, usize, Option<Marks<B>>)> {
    if let Some((mut state, mut marks)) = kept.take() {
        let cached = match &marks.history {
            Some((tokens, at)) if goes_on_from(prompt, tokens) => {
                runner.backend.rewind(&mut state, at)?;
                tokens.len()
            }
            _ => {
                runner.backend.rewind(&mut state, &marks.empty)?;
                // A state rewound before a checkpoint no longer goes back to it.
                marks.history = None;
                0
            }
        };
        return Ok((state, cached, Some(marks)));
    }
    let state = (runner.new_state)(&runner.backend)?;
    if !(runner.keep_states && runner.backend.can_rewind()) {
        return Ok((state, 0, None));
    }
    let mut empty = B::Checkpoint::default();
    runner.backend.save(&state, &mut empty)?;
    let marks = Marks {
        empty,
        history: None,
        peak: 0,
    };
    Ok((state, 0, Some(marks)))
}

/// Publishes the conversation a slot keeps (its tokens) to the slots' [`Marked`].
type Mark<'a> = &'a dyn Fn(Option<Arc<[u32]>>);

fn run_job<B: Backend>(
    runner: &Runner<B>,
    tok: &Tokenizer,
    job: Job,
    closing: &AtomicBool,
    state_bytes: &AtomicUsize,
    metrics: &Metrics,
    (kept, mark): (&mut Kept<B>, Mark<'_>),
) {
    if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
        return;
    }
    let started = Instant::now();
    let Job {
        prompt,
        history,
        params,
        constraint,
        logprobs,
        cancel,
        timeout,
        events,
    } = job;
    let mut hooks = JobHooks {
        events: events.clone(),
        constraint,
        logprobs,
        cancel,
        deadline: started + timeout,
        closing,
        pending: Vec::new(),
        timed_out: false,
        constraint_error: None,
        state_bytes,
        device: &runner.device,
        prompt_tokens: prompt.len(),
        generated: 0,
        metrics,
        last_token: started,
        first: true,
        started,
    };
    state_bytes.store(runner.device.state_bytes(prompt.len()), Ordering::Relaxed);
    let result = slot_state(runner, kept, &prompt).and_then(|(mut state, reused, mut marks)| {
        let mut cached = reused;
        // The conversation so far, fed first and saved for its next request.
        let head = history.filter(|&h| h > cached && h < prompt.len());
        if let (Some(m), Some(h)) = (marks.as_mut(), head) {
            let reuse = m.history.take().map(|(_, at)| at);
            let (b, chunk) = (&runner.backend, params.prefill_chunk);
            let at = engine::prefill_and_save(b, &mut state, &prompt[cached..h], chunk, reuse)?;
            m.history = Some((prompt[..h].into(), at));
            cached = h;
        }
        let r = engine::generate_after(
            &runner.backend,
            tok,
            &mut state,
            &prompt,
            cached,
            &params,
            &mut hooks,
        );
        // A sequence a request failed on is not trusted with the next.
        if let (Ok(_), Some(mut m)) = (&r, marks) {
            m.peak = m.peak.max(runner.backend.state_len(&state));
            *kept = Some((state, m));
        }
        r.map(|g| (g, reused))
    });
    // Told before the client hears the end, so that the conversation's next request finds
    // this slot keeping it.
    mark(kept.as_ref().and_then(|(_, m)| m.tokens()));
    hooks.timed_out = Instant::now() >= hooks.deadline;
    let event = match result {
        Ok((g, reused)) => {
            let finish = match g.finish {
                FinishReason::Stop => Finish::Stop,
                FinishReason::Length | FinishReason::ContextFull => Finish::Length,
                FinishReason::Cancelled if hooks.timed_out => Finish::Length,
                FinishReason::Cancelled => Finish::Cancelled,
            };
            if let Some(e) = hooks.constraint_error.take() {
                Event::Failed(format!("constrained decoding failed: {e}"))
            } else if finish == Finish::Cancelled && closing.load(Ordering::Relaxed) {
                Event::Failed("the server is shutting down; generation was ended".into())
            } else {
                Event::Done {
                    finish,
                    prompt_tokens: g.prompt_tokens,
                    cached_tokens: reused,
                    completion_tokens: g.tokens.len(),
                    logprobs: std::mem::take(&mut hooks.pending),
                }
            }
        }
        Err(e) => Event::Failed(e.to_string()),
    };
    metrics.count_finish(match &event {
        Event::Done {
            finish: Finish::Stop,
            ..
        } => "stop",
        Event::Done {
            finish: Finish::Length,
            ..
        } => "length",
        Event::Done {
            finish: Finish::Cancelled,
            ..
        } => "cancelled",
        _ => "failed",
    });
    let _ = events.send(event);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(prompt: &[u32]) -> (Job, Instant) {
        let (events, _) = mpsc::unbounded_channel();
        let job = Job {
            prompt: prompt.to_vec(),
            history: None,
            params: GenerateParams::default(),
            constraint: None,
            logprobs: None,
            cancel: Arc::new(AtomicBool::new(false)),
            timeout: Duration::from_secs(1),
            events,
        };
        (job, Instant::now())
    }

    /// Slots with these marks (empty: none) and idle flags.
    fn marked(slots: &[(&[u32], bool)]) -> Marked {
        let m = Marked::new(slots.len());
        for (s, &(mark, idle)) in slots.iter().enumerate() {
            m.set_mark(s, (!mark.is_empty()).then(|| mark.into()));
            m.set_idle(s, idle);
        }
        m
    }

    const A: &[u32] = &[1, 2, 3];
    const B: &[u32] = &[7, 8, 9];

    #[test]
    fn a_lone_slot_takes_requests_in_arrival_order_even_past_its_own_conversation() {
        let m = marked(&[(A, true)]);
        let q: VecDeque<_> = [job(&[7, 8, 9, 10]), job(&[1, 2, 3, 4])].into();
        assert_eq!(m.pick(0, &q), Some(0));
    }

    #[test]
    fn a_request_goes_on_in_the_idle_slot_keeping_its_conversation() {
        // Slot 1 keeps A and is idle: slot 0 leaves A's turn to it and takes the next.
        let m = marked(&[(&[], true), (A, true)]);
        let q: VecDeque<_> = [job(&[1, 2, 3, 4]), job(&[5, 6])].into();
        assert_eq!(m.pick(0, &q), Some(1));
        assert_eq!(m.pick(1, &q), Some(0));
        // Busy, it claims nothing.
        m.set_idle(1, false);
        assert_eq!(m.pick(0, &q), Some(0));
    }

    #[test]
    fn a_slot_keeping_a_conversation_leaves_new_ones_to_an_idle_slot_keeping_none() {
        let m = marked(&[(A, true), (&[], true)]);
        let q: VecDeque<_> = [job(&[5, 6])].into();
        assert_eq!(m.pick(0, &q), None);
        assert_eq!(m.pick(1, &q), Some(0));
        // With every other slot keeping one too (or busy), it takes it.
        let m = marked(&[(A, true), (B, true)]);
        assert_eq!(m.pick(0, &q), Some(0));
        // Its own conversation it takes whatever the others are.
        let q: VecDeque<_> = [job(&[1, 2, 3, 9])].into();
        let m = marked(&[(A, true), (&[], true)]);
        assert_eq!(m.pick(0, &q), Some(0));
        assert_eq!(m.pick(1, &q), None);
    }

    #[test]
    fn a_mark_leads_only_a_longer_prompt_that_starts_with_it() {
        let m = marked(&[(A, true)]);
        assert!(m.leads(0, &[1, 2, 3, 4]));
        assert!(!m.leads(0, A));
        assert!(!m.leads(0, &[1, 2, 4, 3]));
        let m = marked(&[(&[], true)]);
        assert!(!m.leads(0, &[1, 2, 3]));
    }
}
