"""The engine's subcommands, `build`, `run`, `bench` and `serve` (fdpp_rewrite.serve), as the package CLI
(fdpp_rewrite.cli) finds them: COMMANDS names HANDLERS[name] = (add_arguments, run). Importing this module is
cheap: torch and the engine load only when a command runs."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from fdpp_rewrite.cli import number
from fdpp_rewrite.cli_args import add_engine_backend, add_force, add_gemm_profile, add_kv_memory
from fdpp_rewrite.engine.buckets import DEFAULT_MAX_BATCH
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.serve import server

HELP = {
    "build": "build a rewritten graph into an engine folder for this GPU (or --backend cpu)",
    "run": "generate text with an engine (streams tokens; greedy unless --temperature)",
    "bench": "decode tokens/s, ms per step, first-token time, percent of the memory roofline and kernels per layer",
    "serve": "an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)",
}


def add_build_arguments(parser) -> None:
    parser.add_argument("model", type=Path, help="the rewritten graph (model.fdpp.onnx from `rewrite`)")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="the engine folder to write (a plan file for --backend tensorrt)")
    parser.add_argument("--max-batch", type=int, help="most sequences decoded together (default 8; 256 with "
                                                      "--kv-memory)")
    parser.add_argument("--max-seq", type=int, help="longest sequence, prompt + new tokens (default: the graph's "
                                                    "cache capacity)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                        help="check the graph has this dtype (default: any; the engine keeps the graph's)")
    parser.add_argument("--backend", choices=["auto", "cuda", "cpu", "migraphx", "tensorrt"], default="auto",
                        help="cuda (this GPU's kernels), cpu (the reference ops), migraphx (AMD, docs/amd.md), "
                             "tensorrt (a TensorRT plan file, docs/tensorrt.md), auto: cuda when a GPU is visible")
    add_gemm_profile(parser)
    parser.add_argument("--tensor-parallel", type=int, metavar="N",
                        help="shard the model over N ranks, one GPU each (1, 2, 4 or 8; docs/tensor-parallel.md); "
                             "default: one unsharded engine")
    add_kv_memory(parser, "a paged KV cache (blocks of 64 tokens shared by up to --max-batch sequences) in this "
                          "much memory: a fraction of the GPU memory free after the weights (0.9) or GiB (20GiB); "
                          "default: contiguous slots of --max-seq each")
    add_force(parser, "the output if it is an engine folder or an empty folder (anything else is refused)")


def add_run_arguments(parser) -> None:
    parser.add_argument("engine", type=Path, help="an engine folder written by `build`")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt (or, with --chat, the user message; default: none)")
    source.add_argument("--prompts-file", type=Path,
                        help="a file of prompts, one per line, decoded as one batch (default: none)")
    source.add_argument("--token-ids",
                        help="a prompt as comma-separated token ids, for engines without a tokenizer (default: none)")
    parser.add_argument("--max-new-tokens", type=number(int, at_least=1), default=64)
    parser.add_argument("--temperature", type=number(float, at_least=0), default=0.0, help="0: greedy (default)")
    parser.add_argument("--top-k", type=number(int, at_least=0), default=0,
                        help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=number(float, above=0, at_most=1), default=1.0,
                        help="sample from the smallest set with this mass, in (0, 1]")
    parser.add_argument("--seed", type=int, help="seed of the sampler (default: none, a fresh seed)")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    add_kv_memory(parser)
    parser.add_argument("--system", help="a system message for --chat (default: none)")
    add_engine_backend(parser)


def add_bench_arguments(parser) -> None:
    parser.add_argument("engine", type=Path, help="an engine folder written by `build`")
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes (default 1)")
    parser.add_argument("--context", type=int, nargs="+", default=[128], help="prompt lengths (default 128)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence (default 128)")
    parser.add_argument("--stream-gib", type=float, default=2.0, help="GiB of the streaming read that sets the "
                                                                      "roofline (default 2)")
    parser.add_argument("--no-graphs", action="store_true", help="run decode steps eagerly (no CUDA graphs)")
    parser.add_argument("--kernels", nargs="+", choices=["fdpp", "torch", "gptfast"], default=["fdpp"],
                        help="fdpp: this project's kernels; torch: the stock baseline (cuBLAS GEMMs with unfused "
                             "epilogues, SDPA attention; same graph, norms, RoPE, CUDA graphs); gptfast: gpt-fast's "
                             "torch.compile decode recipe on the engine's model shapes (random weights, llama "
                             "layouts). fdpp with a peer: the ratios")
    parser.add_argument("--torch-engine", type=Path, metavar="FOLDER",
                        help="the engine folder --kernels torch runs on (default: ENGINE); a paged ENGINE needs a "
                             "contiguous build of the same model here, as SDPA reads contiguous caches")
    parser.add_argument("--ablate", action="store_true", help="also run the engine with each technique switched to "
                        "its baseline, one at a time, and print what each buys (cuda backend)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here (default: print only)")
    add_kv_memory(parser)
    add_engine_backend(parser)


def run_build(args) -> int:
    if args.kv_memory and (args.backend in ("migraphx", "tensorrt") or args.tensor_parallel):
        what = f"--backend {args.backend}" if args.backend in ("migraphx", "tensorrt") else "--tensor-parallel"
        raise FdppError(f"--kv-memory (a paged KV cache) runs on the cuda and cpu backends without tensor "
                        f"parallelism; drop --kv-memory or {what}")
    max_batch = args.max_batch or DEFAULT_MAX_BATCH
    if args.backend == "migraphx":  # the AMD path: its own module (docs/amd.md)
        from fdpp_rewrite.engine.migraphx_build import build_migraphx_engine

        build_migraphx_engine(args.model, args.output, force=args.force)
        return 0
    if args.backend == "tensorrt":  # a serialized TensorRT engine: its own module (docs/tensorrt.md)
        from fdpp_rewrite.engine.tensorrt_build import build_tensorrt_engine

        built = build_tensorrt_engine(args.model, args.output, max_batch=max_batch, max_seq=args.max_seq,
                                      force=args.force)
        print(f"wrote {args.output} ({built['module']} {built['version']}, {built['bytes']} bytes, decode and "
              f"prefill profiles up to batch {max_batch})")
        return 0
    from fdpp_rewrite.engine.build import build_engine

    manifest = build_engine(args.model, args.output, backend=args.backend, max_batch=args.max_batch,
                            max_seq=args.max_seq, dtype=args.dtype, profile=args.profile, force=args.force,
                            tensor_parallel=args.tensor_parallel, kv_memory=args.kv_memory)
    gpu = manifest["gpu"]["name"] if manifest["gpu"] else "cpu"
    paged = f", paged KV cache of {args.kv_memory}" if args.kv_memory else ""
    print(f"wrote {args.output} ({manifest['backend']} backend, {gpu}, {manifest['dtype']}, max batch "
          f"{manifest['max_batch']}, max seq {manifest['max_seq']}, {manifest['glue_ops']['rms_norm']} RMSNorm and "
          f"{manifest['glue_ops']['rope_append']} RopeAppend nodes, "
          f"{len(manifest['gemm_shapes_profiled_now'])} GEMM shapes profiled now{paged})")
    return 0


def _tokenizer(engine):
    from fdpp_rewrite.tokenizer import Tokenizer

    fields = engine.manifest.get("tokenizer")
    return Tokenizer.load(engine.folder, fields) if fields else None


def run_run(args) -> int:
    from fdpp_rewrite.engine.runtime import Engine, Sampler

    sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    engine = Engine(args.engine, backend=args.backend, kv_memory=args.kv_memory)
    tokenizer = _tokenizer(engine)
    if args.token_ids is not None:
        try:
            prompts = [[int(t) for t in args.token_ids.split(",") if t.strip()]]
        except ValueError:
            raise FdppError(f"--token-ids must be comma-separated integers, got {args.token_ids!r}") from None
    else:
        if tokenizer is None:
            raise FdppError(f"{args.engine} has no tokenizer (a random-init export); pass --token-ids 1,2,3")
        texts = [args.prompt] if args.prompt is not None else _read_prompts(args.prompts_file)
        if args.chat:
            texts = [tokenizer.apply_chat_template(
                ([{"role": "system", "content": args.system}] if args.system else [])
                + [{"role": "user", "content": text}]) for text in texts]
        prompts = [tokenizer.encode(text) for text in texts]
    stop = {tokenizer.eos_id} if tokenizer is not None and tokenizer.eos_id is not None else set()
    streamer = _Streamer(tokenizer) if len(prompts) == 1 else None
    result = engine.generate(prompts, args.max_new_tokens, sampler, stop, on_tokens=streamer)
    if streamer is not None:
        streamer.finish(result.tokens[0])
    else:
        for index, ids in enumerate(result.tokens):
            text = tokenizer.decode(ids) if tokenizer is not None else ",".join(map(str, ids))
            print(f"[{index}] {text}")
    produced = sum(len(t) for t in result.tokens)
    decode_s = sum(result.step_s)
    rate = f", {len(result.step_s) * len(prompts) / decode_s:.1f} tokens/s decode" if decode_s else ""
    print(f"[{produced} tokens; first token {result.first_token_s * 1e3:.1f} ms{rate}; {engine.backend.name} backend]",
          file=sys.stderr)
    return 0


def _read_prompts(path: Path) -> list:
    if not path.is_file():
        raise FdppError(f"no prompts file at {path}")
    prompts = [line.rstrip("\n") for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise FdppError(f"{path} has no prompts (one per line)")
    return prompts


class _Streamer:
    """Prints a single sequence's text as its tokens arrive (the decoded text's new suffix each step)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], ""

    def __call__(self, tokens, done):
        if done[0]:
            return
        self.ids.append(tokens[0])
        if self.tokenizer is None:
            print(("," if len(self.ids) > 1 else "") + str(tokens[0]), end="", flush=True)
            return
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):  # wait for a whole UTF-8 character
            print(text[len(self.printed):], end="", flush=True)
            self.printed = text

    def finish(self, ids):
        if self.tokenizer is not None:
            text = self.tokenizer.decode(ids)
            print(text[len(self.printed):] if text.startswith(self.printed) else "", end="")
        print(flush=True)


def run_bench(args) -> int:
    from fdpp_rewrite.engine.bench import bench_command

    command = " ".join(shlex.quote(a) for a in getattr(sys, "orig_argv", sys.argv))  # as typed, interpreter first
    return bench_command(args, command)


HANDLERS = {"build": (add_build_arguments, run_build), "run": (add_run_arguments, run_run),
            "bench": (add_bench_arguments, run_bench), "serve": (server.add_arguments, server.run)}
COMMANDS = {name: (f"{__name__}:{name}", HELP[name]) for name in HANDLERS}  # read by fdpp_rewrite.cli
