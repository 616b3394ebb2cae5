import argparse
import sys


def _serve_parser(sub):
    from vllm.config.device import DeviceConfig

    serve = sub.add_parser("serve", help="Start the server.", add_help=False)
    serve.add_argument("model", nargs="?")
    serve.add_argument("--help", nargs="?", const="", default=None)
    # As vLLM >= 0.9 does: the parser's defaults come from config objects built right here.
    serve.add_argument("--device", default=DeviceConfig().device_type)
    serve.add_argument("--max-model-len", type=int)
    return serve


def main():
    print("INFO imitation-vllm: building the parser")  # vLLM logs to stdout
    parser = argparse.ArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="command")
    serve = _serve_parser(sub)
    args = parser.parse_args()
    if args.command == "serve" and args.help is not None:
        serve.print_help()
        print("all argument groups" if args.help == "all" else "")
        return 0
    parser.print_usage()
    return 2


if __name__ == "__main__":
    sys.exit(main())
