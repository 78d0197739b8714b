#!/usr/bin/env python3
"""Math-Verify (Python) on the same cases as `hacpo grade --input`, for the speed comparison.

Reads a JSONL file of {"gold", "response"} cases (e.g. MATH-500 golds against the reference
solutions, made by the command below), grades every case with Math-Verify's recommended
`verify(parse(gold), parse(response))`, and prints cases/s and the number judged correct.
Single process, as Math-Verify is normally called from a reward function.

  python3 -c "import json; rows=[json.loads(l) for l in open('tests/shared/data/math/math500_test.jsonl')];
  open('/tmp/cases.jsonl','w').writelines(json.dumps({'gold': r['answer'], 'response': r['solution']})+'\\n' for r in rows)"
  python scripts/bench_math_verify.py /tmp/cases.jsonl
  hacpo grade --input /tmp/cases.jsonl > /dev/null          # prints cases/s to stderr
Needs: pip install math-verify
"""
import json
import sys
import time

from math_verify import parse, verify


def main():
    cases = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    correct = 0
    start = time.perf_counter()
    for c in cases:
        gold = parse("$" + c["gold"] + "$")
        answer = parse(c["response"])
        correct += bool(verify(gold, answer))
    seconds = time.perf_counter() - start
    print(json.dumps({"cases": len(cases), "correct": correct, "seconds": seconds, "cases_per_second": len(cases) / seconds}))


if __name__ == "__main__":
    main()
