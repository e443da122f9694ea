"""A generic interpreter over the plan's node list, compiled per bucket by tracing.

`trace(plan, feeds, weights, backend)` runs the graph once, node by node, on the given inputs and returns the
outputs together with a `Program`: the steps that touched device tensors, in order. While tracing, every value
is either *host* (known before the step runs: small initializers, Shape of any tensor, and anything computed
only from host values) or *device* (the feeds, the weights, and anything computed from them). Host values are
computed on the CPU during the trace and baked into the steps (a Reshape's target, a Split's sizes) or uploaded
once as step constants; they are functions of the input shapes only, so one Program serves every call whose
inputs have the same shapes (a bucket). Replaying a Program runs only device work: no host value is computed
again and nothing is read back from the GPU, so it can be captured in a CUDA graph.
Example: in the exporter's prologue, Shape(input_ids) -> Gather(1) -> Range(0, seq, 1) is host (folded to
arange(seq) for this bucket); Add(Unsqueeze(past_len), that range) is a device step with the range as a constant.

Intermediates are dropped right after their last use, so a step's memory is its live set, not the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fdpp_rewrite.engine import mixed, ops
from fdpp_rewrite.engine.backends import FDPP_OPS
from fdpp_rewrite.errors import FdppError


@dataclass
class Step:
    fn: object
    inputs: tuple   # env names ("" = an absent optional input)
    outputs: tuple
    release: tuple = ()  # env names whose last use is this step
    op: str = ""


class Program:
    """The device steps of one bucket, replayable on new inputs of the same shapes (and capturable)."""

    def __init__(self, steps: list, constants: dict, output_names: list, op_counts: dict):
        self.steps = steps
        self.constants = constants  # the weights and uploaded host values the steps read
        self.output_names = output_names
        self.op_counts = op_counts  # op type -> device steps of that type

    def run(self, feeds: dict) -> dict:
        env = dict(self.constants)
        env.update(feeds)
        env[""] = None
        for step in self.steps:
            result = step.fn(*[env[name] for name in step.inputs])
            if len(step.outputs) == 1:
                env[step.outputs[0]] = result
            else:
                for name, value in zip(step.outputs, result):
                    env[name] = value
            for name in step.release:
                del env[name]
        return {name: env[name] for name in self.output_names}


def _attr_value(value):
    if isinstance(value, dict) and "tensor" in value:
        return torch.tensor(value["tensor"], dtype=ops.ONNX_TO_TORCH[value["onnx_type"]]).reshape(value["dims"])
    return value


def prepare_nodes(plan_nodes: list) -> list:
    """The plan's node dicts with attribute tensors turned into torch tensors (once per engine load)."""
    prepared = []
    for node in plan_nodes:
        node = dict(node)
        node["attrs"] = {k: _attr_value(v) for k, v in node.get("attrs", {}).items()}
        prepared.append(node)
    return prepared


def trace(nodes: list, output_names: list, feeds: dict, weights: dict, host_values: dict, backend, layout=None):
    """Run the graph on feeds; return (outputs, Program). host_values: small initializers (CPU tensors);
    weights: device tensors. Feeds that are graph inputs the runtime owns (the KV caches) may be written in
    place by ScatterND / RopeAppend. layout: a mixed step's MixedLayout (mixed.py) or a paged step's PagedLayout
    (paged_step.py), whose wrap(op, fn) splits the RopeAppend and attention steps between the decode rows and the
    chunks."""
    host = dict(host_values)
    device_values = dict(weights)
    device_values.update(feeds)
    device_values[""] = None
    constants = {}
    steps = []
    op_counts = {}

    def device_input(name):
        if name in weights:  # a weight a step reads: the Program keeps a reference
            constants[name] = weights[name]
        if name in device_values:
            return device_values[name]
        if name in host:  # a host value a device step reads: uploaded once, kept as a step constant
            if name not in constants:
                constants[name] = host[name].to(backend.device)
            device_values[name] = constants[name]
            return constants[name]
        raise FdppError(f"the plan reads '{name}' before any node writes it; rebuild the engine")

    for node in nodes:
        op, domain, inputs, outputs = node["op"], node.get("domain", ""), node["inputs"], node["outputs"]
        attrs = node["attrs"]
        if domain == "fdpp":
            if op not in FDPP_OPS:
                raise FdppError(f"fdpp::{op} (node {node['name']}) is not supported by this engine version")
            fn = backend.lower(op, attrs, node["name"])
            if layout is not None and op in mixed.MIXED_OPS:
                fn = layout.wrap(op, fn)
            host_positions = set()
        elif domain == ops.ENGINE_DOMAIN:  # the engine's own ops (CacheAppend), written into the plan by build
            if op not in ops.ENGINE_OPS:
                raise FdppError(f"{domain}::{op} (node {node['name']}) is not supported by this engine version")
            fn = ops.ENGINE_OPS[op]
            host_positions = set()
        elif op == "Shape":  # the shape of any tensor is known on the host
            source = host.get(inputs[0])
            if source is None:
                source = device_input(inputs[0])
            host[outputs[0]] = ops.LOWERINGS["Shape"](attrs, {})(source)
            continue
        elif op == "ScatterND":
            if attrs.get("reduction", "none") != "none":
                raise FdppError(f"ScatterND with reduction {attrs['reduction']!r} is not supported by the engine")
            fn = ops.scatter_nd(in_place=inputs[0] in feeds)
            host_positions = set()
        else:
            lowering = ops.LOWERINGS.get(op)
            if lowering is None:
                raise FdppError(f"ONNX op {op} (node {node['name']}) is not supported by the engine")
            host_positions = ops.HOST_INPUTS.get(op, set())
            for position in host_positions:
                if position < len(inputs) and inputs[position] and inputs[position] not in host:
                    raise FdppError(f"{op} node {node['name']} takes input {position} ('{inputs[position]}') from "
                                    "device data; the engine needs shapes known on the host")
            host_args = {p: host[inputs[p]] for p in host_positions if p < len(inputs) and inputs[p]}
            fn = lowering(attrs, host_args)
            args = [inputs[i] for i in range(len(inputs)) if i not in host_positions]
            if all(name == "" or name in host for name in args):  # host-only: fold now
                values = fn(*[host[name] if name else None for name in args])
                values = values if isinstance(values, tuple) else (values,)
                for name, value in zip(outputs, values):
                    host[name] = value
                continue
        args = [inputs[i] for i in range(len(inputs)) if i not in host_positions]
        values = fn(*[device_input(name) for name in args])
        values = values if isinstance(values, tuple) else (values,)
        for name, value in zip(outputs, values):
            device_values[name] = value
        key = f"{domain}::{op}" if domain else op
        op_counts[key] = op_counts.get(key, 0) + 1
        steps.append(Step(fn, tuple(args), tuple(outputs), op=key))

    results = {}
    for name in output_names:
        if name in device_values:
            results[name] = device_values[name]
        elif name in host:
            results[name] = host[name].to(backend.device)
        else:
            raise FdppError(f"the plan never writes its output '{name}'; rebuild the engine")
    _plan_releases(steps, set(output_names) | set(feeds) | set(constants))
    return results, Program(steps, constants, list(output_names), op_counts)


def _plan_releases(steps: list, keep: set) -> None:
    """Set each step's release list: the intermediates it reads or writes for the last time."""
    last_use = {}
    for index, step in enumerate(steps):
        for name in step.inputs + step.outputs:
            last_use[name] = index
    releases = [[] for _ in steps]
    for name, index in last_use.items():
        if name and name not in keep:
            releases[index].append(name)
    for step, names in zip(steps, releases):
        step.release = tuple(names)
