//! Single-thread throughput of `dot` and `dot_scalar` for every format: packed weight bytes read
//! per second over a matrix larger than the caches.
//!
//! `cargo run --release -p quant --example dot_throughput`

use std::hint::black_box;
use std::time::Instant;

use quant::Format;

fn main() {
    let cols = 5120;
    for format in Format::ALL {
        let rows = (64 << 20) / format.row_bytes(cols).expect("whole blocks");
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let packed = quant::quantize(format, &w).expect("whole blocks");
        drop(w);
        let x: Vec<f32> = (0..cols).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
        let mut out = vec![0.0f32; rows];
        let row_bytes = packed.len() / rows;
        for (name, scalar) in [("dot", false), ("dot_scalar", true)] {
            let start = Instant::now();
            let reps = 3;
            for _ in 0..reps {
                if scalar {
                    for (row, o) in packed.chunks_exact(row_bytes).zip(out.iter_mut()) {
                        *o = quant::dot_scalar(format, row, &x);
                    }
                } else {
                    quant::matvec(format, &packed, rows, cols, &x, &mut out);
                }
                black_box(&out);
            }
            let s = start.elapsed().as_secs_f64() / f64::from(reps);
            println!(
                "{:>10} {:>10}: {:6.2} GB/s of weights, {:6.2} Gvalues/s",
                format.name(),
                name,
                packed.len() as f64 / s / 1e9,
                (rows * cols) as f64 / s / 1e9
            );
        }
    }
}
