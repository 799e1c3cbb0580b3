"""Hardware profile: the numbers the benefit formulas and the cost model read (data only, no behaviour)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MemLevel:
    """One level of the memory hierarchy.

    ``bandwidth_Bps`` is the aggregate bandwidth of the level over the whole chip (bytes/second);
    ``latency_cycles`` the load-to-use latency in SM cycles; ``capacity_bytes`` the capacity visible to the
    scope that owns the level (chip for DRAM/L2, one SM for shared memory and registers).
    """

    name: str  # "dram" | "l2" | "shared" | "register"
    bandwidth_Bps: float
    latency_cycles: float
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class Calibration:
    """Constants of the emitted kernels on this GPU that no datasheet gives (``[calibration]`` in the TOML).

    ``mma_sync_fraction``: the fraction of the tensor peak that warp-level ``mma.sync`` reaches (Hopper's full
    rate needs ``wgmma``); ``l2_fraction``: the fraction of the profile's L2 bandwidth that the operand tiles
    of a GEMM stream at; ``dram_fraction`` likewise for DRAM; ``warp_flight_bytes``: the operand bytes one
    warp keeps in flight (its outstanding asynchronous copies); ``mma_in_flight``: independent MMAs per SM sub-core that hide its latency;
    ``step_cycles``: the cycles one reduction step costs besides its MMAs (barriers, waiting for its copies,
    address arithmetic); ``launch_overhead_s``: one kernel launch as a device timer sees it
    back to back (CUDA-graph replay); ``wgmma_fraction``: the fraction of the tensor peak that warpgroup
    ``wgmma.mma_async`` reaches (0: the GPU has no wgmma, the construction does not consider it);
    ``wgmma_latency_cycles``: the latency of one reduction step's copies under a wgmma kernel's load, which its
    pipeline hides; ``tma_wgmma_fraction``: the fraction of the tensor peak that the warp-specialised wgmma
    kernels with TMA loads reach (0: the construction does not consider them); ``tma_l2_fraction``: the
    fraction of the L2 bandwidth their copies stream the operand tiles at; ``ldmatrix_cycles``: the SM cycles
    one ``ldmatrix.x4`` of an ``mma.sync`` kernel's fragments holds the shared-memory port (0: its 512 bytes at
    the profile's shared bandwidth); ``gather_flight_bytes``: the operand bytes one warp keeps in flight when it
    gathers them element by element (a convolution's implicit GEMM; 0: ``warp_flight_bytes``).

    Graph-defined kernels (:mod:`gensorage.ugraph.block_cost`): ``block_load_flight_bytes``: the tile bytes one
    thread keeps in flight with its element-wise, not prefetched loads; ``block_barrier_cycles``: one
    ``__syncthreads`` with the pipeline drain around it; ``block_mma_cycles``: one ``mma.sync.m16n8k16`` on an
    SM sub-core, fragments loaded; ``block_element_cycles``: issue cycles of one element-wise operation of a
    warp, its index arithmetic included; ``block_stage_cycles``: what one iteration of a software-pipelined
    loop costs besides its phases (the prefetch's guard, commit and wait, the stage arithmetic);
    ``block_max_stages``: the most shared-memory stages the construction gives a loop's ``cp.async`` tiles
    (:mod:`gensorage.construction.pipeline_stages`). Pre-defined element-wise kernels (one output element per thread):
    ``predefined_dram_fraction`` of the DRAM bandwidth. ``read_fraction`` and ``write_fraction``: the fractions of
    the DRAM bandwidth a kernel streams its reads and its writes at (HBM turns its bus around between them, so
    a copy, half of each, reaches less than a read-only stream): the µGraph cost model's floor for the bytes a
    graph-defined or tensor-core kernel moves (:mod:`gensorage.ugraph.cost`); ``convert_flight_bytes``: the
    operand bytes one thread keeps in flight in a tensor-core matmul's converting copies (a float32 operand
    converted to the MMA dtype on its way to shared memory: not asynchronous; 0: not priced).

    The defaults are not measurements: they stand for GPUs no run has calibrated yet (every profile but
    h100 and h200, whose ``[calibration]`` tables name the runs they were fitted on).
    """

    mma_sync_fraction: float = 0.6
    l2_fraction: float = 1.0
    dram_fraction: float = 1.0
    warp_flight_bytes: float = 8192.0
    mma_in_flight: float = 4.0
    step_cycles: float = 100.0
    launch_overhead_s: float = 2e-6
    block_load_flight_bytes: float = 64.0
    block_barrier_cycles: float = 100.0
    block_mma_cycles: float = 16.0
    block_element_cycles: float = 4.0
    block_stage_cycles: float = 32.0
    block_max_stages: float = 3.0
    predefined_dram_fraction: float = 1.0
    read_fraction: float = 1.0
    write_fraction: float = 1.0
    convert_flight_bytes: float = 0.0
    wgmma_fraction: float = 0.0
    wgmma_latency_cycles: float = 2000.0
    tma_wgmma_fraction: float = 0.0
    tma_l2_fraction: float = 0.4
    ldmatrix_cycles: float = 0.0
    gather_flight_bytes: float = 0.0


CALIBRATION_KEYS: tuple[str, ...] = (
    "mma_sync_fraction",
    "l2_fraction",
    "dram_fraction",
    "warp_flight_bytes",
    "mma_in_flight",
    "step_cycles",
    "launch_overhead_s",
    "block_load_flight_bytes",
    "block_barrier_cycles",
    "block_mma_cycles",
    "block_element_cycles",
    "block_stage_cycles",
    "block_max_stages",
    "predefined_dram_fraction",
    "read_fraction",
    "write_fraction",
    "convert_flight_bytes",
    "wgmma_fraction",
    "wgmma_latency_cycles",
    "tma_wgmma_fraction",
    "ldmatrix_cycles",
    "gather_flight_bytes",
    "tma_l2_fraction",
)


@dataclass(frozen=True, slots=True)
class HwProfile:
    """A GPU as the construction tuner sees it. Loaded from ``configs/hw/<name>.toml`` by ``gensorage.hw``."""

    name: str  # short name: "a100", "h100", "h200", "rtx4090", "orin-nano"
    display_name: str
    arch: str  # CUDA arch for codegen, e.g. "sm_90"
    sm_count: int
    clock_hz: float  # boost SM clock
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int  # 32-bit registers
    max_registers_per_thread: int
    shared_mem_per_sm: int  # bytes
    shared_mem_per_block: int  # bytes (opt-in maximum)
    l2_bytes: int
    shared_banks: int
    bank_width_bytes: int
    transaction_bytes: int  # global-memory transaction (sector) size
    dram_bytes: int
    levels: tuple[MemLevel, ...]  # ordered from DRAM (outermost) to registers (innermost)
    # peak FLOP/s per dtype: {"float16": {"cuda": ..., "tensor": ...}, "float32": {...}, ...}
    peak_flops: tuple[
        tuple[str, float, float], ...
    ]  # (dtype, without tensor cores, with tensor cores; 0 if none)
    sources: tuple[tuple[str, str], ...] = field(default=())  # (field, where the value comes from)
    calibration: Calibration = field(default=Calibration())

    def level(self, name: str) -> MemLevel:
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise KeyError(name)

    def flops(self, dtype: str, tensor_cores: bool = False) -> float:
        for dt, cuda, tensor in self.peak_flops:
            if dt == dtype:
                return tensor if (tensor_cores and tensor > 0) else cuda
        raise KeyError(dtype)
