"""Bad arguments to lora_delta / lora_apply raise ValueError/TypeError naming the
argument, in the Python door and (validate=False) in the extension itself."""

from __future__ import annotations

import mlx.core as mx
import pytest

from tests.ops.lora_inputs import make_adapters, random_float
from vllm_metal.ops import lora

ROWS, K, N, SLOTS, RANK = 5, 24, 40, 3, 4


def good():
    ad = make_adapters(SLOTS, RANK, K, N, mx.float16)
    return dict(x=random_float((ROWS, K), mx.float16), idx=mx.array([0, -1, 2, 1, 0], dtype=mx.int32),
                lora_a=ad.lora_a, lora_b=ad.lora_b, scale=ad.scale)


# (argument changes, exception from the Python door, from the extension, message fragment)
CASES = [
    (lambda a: dict(x=a["x"].astype(mx.int32)), TypeError, ValueError, "x must be float16, bfloat16 or float32"),
    (lambda a: dict(idx=a["idx"][:4]), ValueError, ValueError, r"idx must be \[T\]"),
    (lambda a: dict(idx=a["idx"].astype(mx.float32)), TypeError, ValueError, "idx must be"),
    (lambda a: dict(lora_a=a["lora_a"][0]), ValueError, ValueError, "lora_a must be 3-D"),
    (lambda a: dict(lora_b=a["lora_b"][0]), ValueError, ValueError, "lora_b must be 3-D"),
    (lambda a: dict(lora_a=a["lora_a"][..., :-1]), ValueError, ValueError, "does not match x's in = 24"),
    (lambda a: dict(lora_b=a["lora_b"][:2]), ValueError, ValueError, "does not match lora_a's L = 3"),
    (lambda a: dict(lora_b=a["lora_b"][:, :3]), ValueError, ValueError, "and r = 4"),
    (lambda a: dict(lora_a=a["lora_a"].astype(mx.bfloat16)), TypeError, ValueError, "x's dtype|x dtype"),
    (lambda a: dict(lora_b=a["lora_b"].astype(mx.float32)), TypeError, ValueError, "x's dtype|x dtype"),
    # Half stacks beside float32 x must be one half dtype.
    (lambda a: dict(x=a["x"].astype(mx.float32), lora_a=a["lora_a"].astype(mx.bfloat16)), TypeError,
     ValueError, "x's dtype|x dtype"),
    (lambda a: dict(scale=a["scale"][:2]), ValueError, ValueError, r"scale must be"),
    (lambda a: dict(scale=a["scale"].astype(mx.int32)), TypeError, ValueError, "scale must be"),
    (lambda a: dict(lora_a=a["lora_a"][:0], lora_b=a["lora_b"][:0], scale=a["scale"][:0]), ValueError,
     ValueError, "at least one slot"),
]


def call(args, door: bool, **extra):
    names = ["x", "idx", "lora_a", "lora_b", "scale"]
    return lora.lora_delta(*(args[n] for n in names), validate=door, **extra)


@pytest.mark.parametrize("door", [True, False], ids=["python", "extension"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_lora_delta_refuses_bad_arguments(case, door):
    change, door_error, ext_error, message = CASES[case]
    args = good()
    args.update(change(args))
    with pytest.raises(door_error if door else ext_error, match=message):
        call(args, door)


APPLY_CASES = [
    (lambda a: dict(y=random_float((ROWS, 50), mx.float32)), TypeError, ValueError, "dtype"),
    (lambda a: dict(y=random_float((ROWS + 1, 50), mx.float16)), ValueError, ValueError,
     "y must be \\[..., out_cols\\] with x's leading dimensions"),
    (lambda a: dict(column_offset=11), ValueError, ValueError, r"\[11, 51\) must lie within y's 50 columns"),
    (lambda a: dict(column_offset=-1), ValueError, ValueError, "must lie within"),
]


@pytest.mark.parametrize("door", [True, False], ids=["python", "extension"])
@pytest.mark.parametrize("case", range(len(APPLY_CASES)))
def test_lora_apply_refuses_bad_arguments(case, door):
    change, door_error, ext_error, message = APPLY_CASES[case]
    args = dict(good(), y=random_float((ROWS, 50), mx.float16), column_offset=0)
    args.update(change(args))
    with pytest.raises(door_error if door else ext_error, match=message):
        lora.lora_apply(args["y"], args["x"], args["idx"], args["lora_a"], args["lora_b"], args["scale"],
                        column_offset=args["column_offset"], validate=door)


def test_non_arrays_are_named():
    args = good()
    args["x"] = args["x"].tolist()
    with pytest.raises(TypeError, match="x must be an mx.array"):
        call(args, True)
    args = good()
    args["idx"] = [0, 1, 2, 0, 0]
    with pytest.raises(TypeError, match="idx must be an mx.array"):
        call(args, True)
