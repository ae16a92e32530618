r"""DeepSpeed ZeRO-3's optimizer step without offload, sub-group by sub-group
(``DeepSpeedZeroOptimizer_Stage3``, runtime/zero/stage3.py, DeepSpeed 0.19.8).

``_create_fp16_sub_groups`` cuts each optimizer group into sub-groups of ``sub_group_size`` (1e9 elements by
default, zero/config.py): parameters are appended in order, each by its partition (:math:`\lceil n / N
\rceil` elements on a rank), and a sub-group closes once it reaches the size, so the last parameter can
carry it past. ``step`` first takes the gradient norm (``_get_norm_groups`` -> ``get_grad_norm_direct``,
whether or not it clips): each parameter's gradient partition ``.to(get_norm_dtype())``, an fp64 copy of
:math:`8 \lceil n / N \rceil` bytes freed once its norm is taken, the largest parameter's the largest. It
then prepares, steps and releases one sub-group at a time:
``_prepare_fp32_grad_for_sub_group`` runs ``self.flatten(self.averaged_gradients[i]).to(fp32)``, where
``averaged_gradients[i]`` lists the sub-group's gradient partitions (views of ``grad_partitions_flat_buffer``)
and ``flatten`` is ``torch._utils._flatten_dense_tensors``: a ``cat`` into a new tensor in the gradients'
dtype (a view when the list holds one tensor), then the fp32 copy while that flat copy is still bound. For a
sub-group of :math:`s` elements in :math:`b`-byte gradients the instant of the copy holds

.. math:: b\,s + 4 s \quad (b < 4), \qquad 4 s \quad (b = 4: ``.to`` returns the flat copy itself),

the flat copy freed once the statement ends; the optimizer then steps the sub-group with the fp32 gradient
and its own temporaries (``_optimizer_step``), and ``_release_sub_group`` drops the fp32 gradient before
the next sub-group. The step's temporaries are the largest of the norm's copy and the two instants over
the sub-groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.zero12_reductions import NORM_BYTES, largest_trained_param, run_module_order
from tuneplan.estimator.xp import ceil_div

if TYPE_CHECKING:
    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import Run

DS_SUB_GROUP = 1_000_000_000  # elements, DeepSpeed's default sub_group_size (runtime/zero/config.py)


def zero3_sub_groups(run: Run, partition: int) -> list[tuple[int, int]]:
    """(elements, tensors) of each of rank 0's sub-groups, as ``_create_fp16_sub_groups`` cuts them.

    A full fine-tune's parameters in module order (:func:`full_module_order`; the norms, in the Trainer's
    no-decay group, are too small to move a cut), each by its :math:`\\lceil n / N \\rceil` partition;
    other runs train few enough parameters to be one sub-group of ``partition`` elements."""
    if run.setup.method != "full" or partition < DS_SUB_GROUP:
        return [(partition, 2)]
    world_size = run.setup.world_size
    sizes = [ceil_div(n, world_size)
             for n in run_module_order(run)]
    groups: list[tuple[int, int]] = []
    elements = tensors = 0
    for size in sizes:
        elements, tensors = elements + size, tensors + 1
        if elements >= DS_SUB_GROUP:
            groups.append((elements, tensors))
            elements = tensors = 0
    if tensors:
        groups.append((elements, tensors))
    return groups


def zero3_step_temp(run: Run, partition: int, client: Callable[[int], OptimizerPlan]) -> int:
    """The step's temporaries: the norm's fp64 copy of the largest gradient partition, and over the
    sub-groups the larger of the flat copy beside its fp32 copy and the fp32 gradient beside the
    optimizer's own temporaries (``client(elements)``: the optimizer as DeepSpeed hands it that sub-group's
    fp32 partition)."""
    grad_bytes = run.dtypes.compute
    largest = NORM_BYTES * ceil_div(largest_trained_param(run), run.setup.world_size)
    for elements, tensors in zero3_sub_groups(run, partition):
        flat = elements * grad_bytes if tensors > 1 else 0
        fp32 = 4 * elements if grad_bytes < 4 else flat
        at_copy = flat + fp32 if grad_bytes < 4 else flat
        largest = max(largest, at_copy, fp32 + client(elements).temp)
    return largest
