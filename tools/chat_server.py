#!/usr/bin/env python3
"""A local OpenAI-compatible chat-completions endpoint over a Hugging Face model directory, for
`adapt.adapter = "openai"` without a network (the environment model of the coding setting, or of
any environment). CPU or GPU, one request at a time; nothing is downloaded.

    python3 tools/chat_server.py models/smollm2-135m --port 8321 [--max-tokens 768]
    rla-pipe run pipelines/coding-smollm2.toml --set adapt.adapter='"openai"' \\
        --set adapt.openai.endpoint='"http://127.0.0.1:8321/v1"' --set adapt.openai.api_key_env='""'

Serves POST /v1/chat/completions (messages, temperature, max_tokens, seed): the messages go
through the model's chat template, the reply is sampled with transformers' `generate` (greedy at
temperature 0). Needs torch and transformers.
"""
import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory (config.json, weights, tokenizer)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8321)
    ap.add_argument("--max-tokens", type=int, default=768, help="reply tokens when a request names none")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            pass

        def reply(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            if not self.path.endswith("/chat/completions"):
                return self.reply(404, {"error": {"message": f"no route {self.path}"}})
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                messages = req["messages"]
            except (ValueError, KeyError) as e:
                return self.reply(400, {"error": {"message": f"bad request: {e}"}})
            t = float(req.get("temperature", 1.0))
            n = int(req.get("max_tokens") or args.max_tokens)
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
            if not torch.is_tensor(ids):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            with lock, torch.no_grad():
                if "seed" in req:
                    torch.manual_seed(int(req["seed"]))
                out = model.generate(ids, max_new_tokens=n, do_sample=t > 0,
                                     temperature=t if t > 0 else None, top_p=None, top_k=None,
                                     pad_token_id=tok.eos_token_id)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            self.reply(200, {
                "id": "chatcmpl-local", "object": "chat.completion", "model": req.get("model", ""),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
            })

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"serving {args.model} at http://{args.host}:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
