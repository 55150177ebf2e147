//! A folded norm's pieces gathered in a cluster of binary GEMV blocks (`fold_cluster`) rather than
//! by arrival counters.

use super::*;

/// Blocks of a cluster that gathers a folded norm's piece (`kernels/gemv_b1.cu`,
/// `fold_cluster`): a 128-row piece in tiles of 16 rows.
pub const FOLD_CLUSTER: usize = 8;

/// Which residual GEMVs gather their folded norms' pieces in clusters ([`cluster_fold`]) rather
/// than by arrival counters: none, those of Q2_0 g64 rows (the default), or every format's
/// (`NIWAKI_CUDA_FOLD_CLUSTER=0` and `=1`). Measured on the H200 (`niwaki bench --device cuda
/// -p 0 -n 128 -r 3`, medians, the setting alternated in one call, the thirty-sixth session):
/// Q2_0 319.13 and 319.80 tok/s in clusters against 314.81 and 314.87 by counters (+1.5%; the
/// harness's single runs in another call 322.1 against 318.0); PQ2_0 (g128 rows) 325.56 against
/// 327.27 (−0.5%); Q1_0 438.9 against 444.3 in the harness (its `_c` kernels take tiles of 16
/// rows where 32 are its default; alternated in an earlier call 392.2 and 391.1 against 396.3
/// and 397.7, −1.2%). The bits are the counters' either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterFold {
    Off,
    Q2G64,
    All,
}

impl ClusterFold {
    /// From `NIWAKI_CUDA_FOLD_CLUSTER` (`0` or `1`), where set.
    pub fn from_setting(on: Option<bool>) -> ClusterFold {
        match on {
            None => ClusterFold::Q2G64,
            Some(true) => ClusterFold::All,
            Some(false) => ClusterFold::Off,
        }
    }

    /// Whether the residual GEMVs of `format`'s rows take the clusters.
    pub fn takes(self, format: GpuFormat) -> bool {
        match self {
            ClusterFold::Off => false,
            ClusterFold::Q2G64 => format == GpuFormat::Q2G64,
            ClusterFold::All => true,
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(c: u8) -> ClusterFold {
        match c {
            0 => ClusterFold::Off,
            1 => ClusterFold::Q2G64,
            _ => ClusterFold::All,
        }
    }
}

/// The binary decode GEMV `l` of `rows` rows with the next norm's fold gathered in clusters of
/// [`FOLD_CLUSTER`] blocks rather than by arrival counters: its `_c` kernel, one block per
/// tile. `None` where that does not apply: tiles of other than 16 rows, rows not whole pieces
/// of 128, more tiles than blocks resident at once (a cluster's blocks gather once, after their
/// only tile, and a second round of clusters would trail the first), or a kernel with no `_c`
/// form (those the residual GEMVs of the 27B and the harness's smaller models take).
pub fn cluster_fold(l: GemvB1Launch, rows: usize) -> Option<GemvB1Launch> {
    let kernel = match l.kernel {
        "gemv_b1_j6x" => "gemv_b1_j6x_c",
        "gemv_b1_j6" => "gemv_b1_j6_c",
        "gemv_b2g64_j12x" => "gemv_b2g64_j12x_c",
        "gemv_b2g64_j12" => "gemv_b2g64_j12_c",
        "gemv_b2g128_j12x" => "gemv_b2g128_j12x_c",
        "gemv_b2g128_j12" => "gemv_b2g128_j12_c",
        _ => return None,
    };
    // One block per tile: the plan's grid already holds every tile where they fit at once.
    let one_wave = l.grid == rows / 16;
    (l.tile_rows == 16 && rows > 0 && rows.is_multiple_of(16 * FOLD_CLUSTER) && one_wave).then_some(
        GemvB1Launch {
            kernel,
            image_kernel: None,
            ..l
        },
    )
}
