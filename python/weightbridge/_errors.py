"""The exceptions the package raises for the C library's errors: one class per project code
(common/common.h's WB_E_*) and per errno value an endpoint call returns, all subclasses of
:class:`WeightbridgeError`, so a retry loop can tell "the job ended" from "this version failed"
from "timed out" by class, and ``except WeightbridgeError`` still catches everything."""

from __future__ import annotations

import errno

from . import _lib


class WeightbridgeError(RuntimeError):
    """A failure of the C library: ``code`` is its (negative) error code, the message its text."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class ConfigError(WeightbridgeError):
    """WB_E_CONFIG: a configuration, or a registration the controller refused (every problem
    listed in the message)."""


class MatchError(WeightbridgeError):
    """WB_E_MATCH: trainer and rollout parameters do not match."""


class PlanError(WeightbridgeError):
    """WB_E_PLAN: the layouts cannot be planned."""


class WireVersionError(WeightbridgeError):
    """WB_E_VERSION: a control message of a protocol version this library does not speak."""


class TokenError(WeightbridgeError):
    """WB_E_TOKEN: the controller refused the cluster token."""


class PeerError(WeightbridgeError):
    """WB_E_PEER: a version failed (the message has the controller's reason), a peer died or
    stopped answering, or the controller could not be reached."""


class CudaError(WeightbridgeError):
    """WB_E_CUDA: a CUDA runtime call failed."""


class FabricError(WeightbridgeError):
    """WB_E_FABRIC: a libfabric call failed."""


class NoGpuError(WeightbridgeError):
    """WB_E_NOGPU: a GPU was needed and none is usable."""


class BoundsError(WeightbridgeError):
    """WB_E_BOUNDS: a write would fall outside its destination region."""


class JobEnded(WeightbridgeError):
    """WB_E_ENDED: the controller shut the job down (``wb-ctl shutdown``); nothing more will
    happen on this endpoint."""


class HelloError(WeightbridgeError):
    """WB_E_HELLO: a control message on a connection it is not bound to."""


class Timeout(WeightbridgeError, TimeoutError):
    """ETIMEDOUT: the wait's ``timeout`` passed (also a built-in ``TimeoutError``)."""


class Closed(WeightbridgeError):
    """EBADF: the endpoint was closed."""


class InvalidArgument(WeightbridgeError):
    """EINVAL: a call the endpoint refuses (a version not newer than the last, never pushed)."""


class Busy(WeightbridgeError):
    """EBUSY: too many versions in flight, or the endpoint already started."""


class MemoryChanged(WeightbridgeError):
    """EFAULT: a registered tensor's memory changed since it was registered."""


BY_CODE = {
    -_lib.WB_E_CONFIG: ConfigError,
    -_lib.WB_E_MATCH: MatchError,
    -_lib.WB_E_PLAN: PlanError,
    -_lib.WB_E_VERSION: WireVersionError,
    -_lib.WB_E_TOKEN: TokenError,
    -_lib.WB_E_PEER: PeerError,
    -_lib.WB_E_CUDA: CudaError,
    -_lib.WB_E_FABRIC: FabricError,
    -_lib.WB_E_NOGPU: NoGpuError,
    -_lib.WB_E_BOUNDS: BoundsError,
    -_lib.WB_E_ENDED: JobEnded,
    -_lib.WB_E_HELLO: HelloError,
    -errno.ETIMEDOUT: Timeout,
    -errno.EBADF: Closed,
    -errno.EINVAL: InvalidArgument,
    -errno.EBUSY: Busy,
    -errno.EFAULT: MemoryChanged,
}

NAMES = [c.__name__ for c in BY_CODE.values()]


def error(code: int, message: str) -> WeightbridgeError:
    """The exception for a (negative) error code: its class, or WeightbridgeError itself."""
    return BY_CODE.get(int(code), WeightbridgeError)(int(code), message)
