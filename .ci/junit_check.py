"""Fail a CI step whose pytest session ran no test (or, with --no-skips, skipped any); print its recorded figures.

Usage: python .ci/junit_check.py JUNIT_XML LABEL [--no-skips] [--figures PREFIX ...]
"""

import argparse
import sys
import xml.etree.ElementTree as ET

parser = argparse.ArgumentParser()
parser.add_argument("junit")
parser.add_argument("label")
parser.add_argument("--no-skips", action="store_true", help="a skipped test fails the step")
parser.add_argument("--figures", nargs="*", default=[], help="print the test properties whose names start so")
args = parser.parse_args()
suite = ET.parse(args.junit).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
skipped = int(suite.get("skipped", 0))
ran = int(suite.get("tests", 0)) - skipped
print(f"{args.label}: {ran} test(s) ran, {skipped} skipped")
for prop in suite.iter("property"):
    if args.figures and prop.get("name", "").startswith(tuple(args.figures)):
        print(f"  {prop.get('name')}: {prop.get('value')}")
sys.exit(0 if ran > 0 and not (args.no_skips and skipped) else 1)
