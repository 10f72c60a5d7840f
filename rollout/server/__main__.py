"""`python -m rollout.server [--tiny | --model DIR | --replay ... | --fixed-latency-s S] [--port P]`: the development
server (rollout/server/app.py)."""

from rollout.server.app import main

if __name__ == "__main__":
    main()
