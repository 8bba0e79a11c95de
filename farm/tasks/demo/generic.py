"""Demo generic (setup -> agent -> verify) tasks.

Keys starting with ``_`` drive the generator (files of the task's repo, of the state
setup leaves, and of the solved workspace from which the gold patch is diffed); the
rest is the farm task row.
"""

from __future__ import annotations

_TIMEOUTS = {"workspace_s": 120, "setup_s": 120, "agent_s": 600, "test_s": 120}

# The verifier runs the workspace's fizzbuzz out of its own process (farm_verify: a fresh
# Python process with a time limit; the answers come back as plain JSON values) and gives
# the fraction of correct answers through farm's reward channel, which the workspace's
# code cannot write (farm.grading.reward).
_FIZZBUZZ_VERIFY = r"""python - <<'EOF'
import farm_verify


def expected(n):
    return "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)


cases = list(range(1, 31))
try:
    results = farm_verify.call_many("fizzbuzz", "fizzbuzz", [[n] for n in cases], timeout=60)
except farm_verify.Failed as exc:
    print(exc)
    results = []
good = sum(1 for n, r in zip(cases, results) if r.ok and r.value == expected(n))
farm_verify.reward(good / len(cases))
print(f"{good}/{len(cases)} correct")
EOF"""

_FIZZBUZZ_STUB = '''"""FizzBuzz."""


def fizzbuzz(n: int) -> str:
    # TODO: implement (see the task)
    return str(n)
'''
_FIZZBUZZ_SOLVED = '''"""FizzBuzz."""


def fizzbuzz(n: int) -> str:
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
'''

GENERIC_TASKS: list[dict] = [
    {
        "id": "demo-generic-greeting",
        "instruction": "Create a file named greeting.txt in the current directory containing exactly one line: hello, farm\n",
        "verify_commands": ["test -f greeting.txt", "grep -qx 'hello, farm' greeting.txt"],
        "solution_commands": ["printf 'hello, farm\\n' > greeting.txt"],
        "timeouts": _TIMEOUTS,
        "_gold_files": {"greeting.txt": "hello, farm\n"},
    },
    {
        "id": "demo-generic-sum",
        "instruction": "numbers.txt holds one integer per line. Write their sum (just the number) to total.txt.\n",
        "setup_commands": ["seq 1 100 > numbers.txt"],
        "verify_commands": [
            "test -f total.txt",
            "test \"$(tr -d '[:space:]' < total.txt)\" = \"$(python -c 'print(sum(int(x) for x in open(\"numbers.txt\")))')\"",
        ],
        "solution_commands": ["python -c 'print(sum(int(x) for x in open(\"numbers.txt\")))' > total.txt"],
        "timeouts": _TIMEOUTS,
        "_setup_files": {"numbers.txt": "".join(f"{i}\n" for i in range(1, 101))},
        "_gold_files": {"total.txt": "5050\n"},
    },
    {
        "id": "demo-generic-fizzbuzz",
        "instruction": (
            "Implement fizzbuzz(n) in fizzbuzz.py: return 'Fizz' for multiples of 3, 'Buzz' for multiples "
            "of 5, 'FizzBuzz' for multiples of both, and str(n) otherwise.\n"
        ),
        "verify_commands": [_FIZZBUZZ_VERIFY],
        "reward_file": "/tmp/farm-reward.txt",
        "timeouts": _TIMEOUTS,
        "_repo_name": "fizzbuzz",
        "_repo_files": {"fizzbuzz.py": _FIZZBUZZ_STUB, ".gitignore": "__pycache__/\n"},
        "_gold_files": {"fizzbuzz.py": _FIZZBUZZ_SOLVED},
    },
]
