"""GPU + interconnect profile: datasheet numbers, each with its public source."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from k3sim.configs.bounds import bounded_float, bounded_int
from k3sim.configs.dtypes import check_dtype

# Documented ranges (k3sim/configs/bounds.py): an HBM of 1e30 bytes or a bandwidth of 1 B/s is refused.
HBMBytes = bounded_float("hbm_bytes")
Bandwidth = bounded_float("bandwidth")
Flops = bounded_float("flops")
GPUs = bounded_int("gpus")
SMs = bounded_int("sms")

# Fields that hold a datasheet number and therefore need an entry in `sources`.
DATASHEET_FIELDS = (
    "hbm_bytes",
    "hbm_bandwidth_bytes_per_s",
    "peak_flops_per_s",
    "scaleup_bandwidth_bytes_per_s",
    "scaleup_domain_gpus",
    "scaleout_bandwidth_bytes_per_s",
    "num_sms",
)


class DerivedFrom(BaseModel):
    """A profile whose kernel and collective times are another profile's measurements rescaled to this one's
    datasheet figures (`k3sim.kernels.store.Derivation`: compute-bound kept, memory-bound times the HBM
    bandwidth ratio, a collective's bandwidth part times the link ratio, latency kept). `profile` names the
    measured profile (a name in hardware_profiles/ or a path); `ignores` says, one line each, what the
    rescaling leaves out: the uncertainty every derived answer carries (shown with it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    profile: str = Field(min_length=1)
    ignores: tuple[str, ...] = Field(min_length=1, description="what the derivation does not model")


class HardwareProfile(BaseModel):
    """One GPU kind. FLOP/s are dense Tensor-Core peaks (NVIDIA sheets print sparsity-doubled ones).

    Bandwidths are per GPU, one direction. `calibration_dir` (relative to `hardware_profiles/`) names
    where measured kernel data for this profile lives; fitted parameters live there, not here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # datasheet figures: finite
    name: str
    description: str | None = None
    hbm_bytes: HBMBytes = Field(description="HBM capacity per GPU, bytes")
    hbm_bandwidth_bytes_per_s: Bandwidth
    peak_flops_per_s: dict[str, Flops] = Field(description="dense peak per dtype, FLOP/s")
    scaleup_bandwidth_bytes_per_s: Bandwidth = Field(description="NVLink per GPU, one direction")
    scaleup_domain_gpus: GPUs = Field(description="GPUs in one NVLink domain")
    scaleout_bandwidth_bytes_per_s: Bandwidth = Field(description="NIC per GPU, one direction")
    # the GPU's link to host memory (PCIe, or Grace's NVLink-C2C), one direction; None: not known (an offload tier
    # under the prefix cache is then refused: k3sim.prefix_cache.offload.host_link); a datasheet figure with a source
    host_link_bandwidth_bytes_per_s: Bandwidth | None = Field(None, description="GPU to host memory, one direction")
    num_sms: SMs
    sources: dict[str, str]
    calibration_dir: str | None = None
    derived_from: DerivedFrom | None = None  # kernel times from another profile's measurements, rescaled

    @model_validator(mode="after")
    def _checks(self) -> "HardwareProfile":
        # a derived profile's times come from its source's rows: its own measured directory would be a second
        # answer to the same question (and a derived profile derived again would compound the rescaling)
        if self.derived_from is not None and self.calibration_dir:
            raise ValueError("derived_from and calibration_dir exclude each other: a profile answers from its own "
                             "measurements or from another's rescaled; remove one")
        if self.derived_from is not None and self.derived_from.profile == self.name:
            raise ValueError(f"derived_from names the profile itself ('{self.name}'): name the measured profile")
        for key in self.peak_flops_per_s:
            check_dtype(key)
        missing = [f for f in DATASHEET_FIELDS if f not in self.sources]
        if self.host_link_bandwidth_bytes_per_s is not None and "host_link_bandwidth_bytes_per_s" not in self.sources:
            missing.append("host_link_bandwidth_bytes_per_s")
        if missing:
            raise ValueError(f"sources lacks an entry for {', '.join(missing)}")
        unknown = [k for k in self.sources if k not in type(self).model_fields]
        if unknown:
            raise ValueError(f"sources names unknown fields {', '.join(unknown)}")
        return self
