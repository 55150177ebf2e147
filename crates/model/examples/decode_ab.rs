//! Experiment: two prefetch modes of the tiled kernels, alternated step by step in one process.
use std::time::Instant;

use model::{Kernels, Logits, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = args.get(2).map_or(Ok(24), |s| s.parse())?;
    let modes: [u8; 2] = [0, args.get(3).map_or(Ok(4), |s| s.parse())?];
    model::pool::init(2);
    let mut m = Model::open(&args[1])?;
    m.set_kernels(Kernels::Int8);
    let mut st = m.new_state();
    m.forward(&mut st, &[1], Logits::Last)?;
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..2 * steps {
        let k = [0, 1, 1, 0][i % 4];
        quant::set_prefetch_mode(modes[k]);
        let t = Instant::now();
        m.forward(&mut st, &[(i % 1000) as u32 + 2], Logits::Last)?;
        times[k].push(t.elapsed().as_secs_f64());
    }
    for k in 0..2 {
        let mut v = times[k].clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "mode {}: median {:.1} ms, mean {:.1} ms, min {:.1} ms ({} steps)",
            modes[k],
            1e3 * v[v.len() / 2],
            1e3 * mean,
            1e3 * v[0],
            v.len()
        );
    }
    Ok(())
}
