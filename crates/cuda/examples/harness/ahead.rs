//! Greedy decoding with the host off the critical path (`CudaModel::forward_greedy` launching
//! each step before the previous pick is read, rows looked up on the device by `embed_row`)
//! against one-token passes the host embeds and waits for, bit for bit.

use model::synth::{self, Preset};
use model::Logits;
use niwaki_cuda::repack::FORMATS;
use niwaki_cuda::CudaModel;
use quant::Format;

use crate::models::rotated;
use crate::report::*;

/// What one sequence of calls gave.
#[derive(PartialEq)]
struct Session {
    /// Picks of a prompt and of free-running steps (each feeding the previous pick).
    free: Vec<u32>,
    /// Picks of calls feeding other tokens than the picks (each drops the step run ahead),
    /// then of a three-token call.
    forced: Vec<u32>,
    /// The logits of a host-logits call after the last greedy call (its bits).
    logits: Vec<u32>,
    len: usize,
}

const FREE_STEPS: usize = 24;

fn session(g: &CudaModel, vocab: usize) -> R<(Session, usize)> {
    let prompt: Vec<u32> = (0..13).map(|i| (i * 397 % vocab) as u32).collect();
    let mut st = g.new_state(256)?;
    let mut free = vec![g.forward_greedy(&mut st, &prompt)?];
    let mut ahead = 0;
    for _ in 0..FREE_STEPS {
        let t = *free.last().ok_or("no pick")?;
        free.push(g.forward_greedy(&mut st, &[t])?);
        ahead += usize::from(st.ahead_pending());
    }
    // The first and last rows of the table among them.
    let v = vocab as u32;
    let mut forced = Vec::new();
    for t in [0, v - 1, 5, 5, 1234 % v, v - 2, 77] {
        forced.push(g.forward_greedy(&mut st, &[t])?);
    }
    forced.push(g.forward_greedy(&mut st, &[3, 4, 5])?);
    let logits = g.forward(&mut st, &[7], Logits::Last)?;
    let s = Session {
        free,
        forced,
        logits: logits.iter().map(|x| x.to_bits()).collect(),
        len: st.len(),
    };
    Ok((s, ahead))
}

pub(crate) fn greedy_ahead(rep: &mut Report) -> R<()> {
    rep.line(format!("Greedy decoding run ahead of the host (each step launched before the previous pick is read, its row looked up on the device) and the device's lookup alone, against one-token passes the host embeds and waits for: small preset, vocabulary 4096; a 13-token prompt and {FREE_STEPS} free-running steps, 7 calls feeding other tokens than the picks (ids 0 and 4095 among them: each drops the step run ahead), a 3-token call, then host logits for one more token. Everything must be equal in every bit, and every free-running step must have run ahead when running ahead is on, none when it is off."));
    rep.line("");
    rep.line("| model | result | device lookup | run ahead | free-running steps run ahead | tokens in the state |");
    rep.line("|---|---|---|---|---|---|");
    let vocab = 4096;
    let shape = Preset::Small.shape(vocab);
    let mut models = Vec::new();
    for format in FORMATS {
        let t = synth::random_f32_tensors(&shape, format, 9);
        let m = open(&synth::writer_from_f32(&shape, &t, format, "h")?)?;
        models.push((format.to_string(), m, true));
    }
    for format in [Format::Q2_0, Format::PTQ1_0] {
        let m = rotated(&shape, format, 9)?;
        models.push((format!("{format}, Hadamard-rotated"), m, true));
    }
    for (name, m, want_table) in models {
        let g = CudaModel::load(&m)?;
        let table = g.has_device_embedding();
        g.set_device_embed(false);
        g.set_run_ahead(false);
        let (host, host_ahead) = session(&g, vocab)?;
        g.set_device_embed(true);
        let (device, device_ahead) = session(&g, vocab)?;
        g.set_run_ahead(true);
        let (ahead, ahead_steps) = session(&g, vocab)?;
        let ok = table == want_table
            && device == host
            && ahead == host
            && host_ahead == 0
            && device_ahead == 0
            && ahead_steps == FREE_STEPS;
        let same = |s: &Session| if *s == host { "same" } else { "DIFFERENT" };
        rep.line(format!(
            "| {name} | {} | {} | {} | {ahead_steps} of {FREE_STEPS} | {} |",
            if ok { "PASS" } else { "FAIL" },
            same(&device),
            same(&ahead),
            host.len
        ));
        rep.check(ok, format!("greedy run ahead, {name}"));
    }
    Ok(())
}
