#!/usr/bin/env python3
"""Synthetic 8-K-style filings with a soft label that the text determines (learnably).

Deterministic: the same --seed and --n give the same bytes on any machine (Python's
random.Random is specified to be reproducible across platforms for the same seed).

Each record is {"text": ..., "label": p, "date": "YYYY-MM-DD", "company": ...}.  The label is
sigmoid(0.9 * (positive phrases - negative phrases) + 0.4 * guidance), rounded to 4 decimals,
where guidance is +1 / -1 / 0 for a raised / lowered / kept outlook sentence: a model that
reads the phrases can learn it, a model that counts tokens cannot.

    tools/gen-filings.py --n 400 --seed 1 > conf/demo/filings-train.jsonl
    tools/gen-filings.py --n 100 --seed 2 > conf/demo/filings-valid.jsonl
"""
import argparse
import json
import math
import random
import sys

PREFIX = ["Apex", "Blue Ridge", "Cascade", "Delta", "Evergreen", "Frontier", "Granite",
          "Harbor", "Ironwood", "Juniper", "Keystone", "Lakeshore", "Meridian", "Northstar",
          "Oakmont", "Pinnacle", "Quarry", "Redwood", "Summit", "Tidewater", "Union",
          "Vanguard", "Westfield", "Yellowstone", "Zenith", "O'Brien", "Müller", "Société"]
SUFFIX = ["Holdings", "Bancorp", "Energy", "Pharmaceuticals", "Industries", "Technologies",
          "Financial", "Logistics", "Semiconductor", "Realty Trust", "Foods", "Airlines",
          "Insurance Group", "Therapeutics", "Retail", "Communications"]
FORM = ["Inc.", "Corp.", "Co.", "Ltd.", "L.P.", "plc", "N.V.", "S.A."]
STATES = ["Delaware", "Nevada", "New York", "Maryland", "Texas", "California", "Ohio"]
CITIES = ["New York, NY", "Houston, TX", "Chicago, IL", "San Jose, CA", "Boston, MA",
          "Atlanta, GA", "Denver, CO", "Seattle, WA", "Charlotte, NC", "Minneapolis, MN"]
ITEMS = [
    ("1.01", "Entry into a Material Definitive Agreement"),
    ("2.02", "Results of Operations and Financial Condition"),
    ("2.03", "Creation of a Direct Financial Obligation"),
    ("5.02", "Departure of Directors or Certain Officers; Election of Directors"),
    ("7.01", "Regulation FD Disclosure"),
    ("8.01", "Other Events"),
    ("9.01", "Financial Statements and Exhibits"),
]
POSITIVE = ["record revenue", "exceeded expectations", "strong demand", "margin expansion",
            "increased its quarterly dividend", "successful launch", "improved profitability",
            "robust cash flow", "market share gains", "upgraded its credit rating"]
NEGATIVE = ["impairment charge", "below expectations", "weaker demand", "margin pressure",
            "suspended its dividend", "product recall", "restructuring costs",
            "covenant waiver", "material weakness", "going concern"]
NEUTRAL = [
    "The Company's Board of Directors approved the matters described below.",
    "A copy of the press release is furnished as Exhibit 99.1 to this Current Report.",
    "The information in this Item shall not be deemed \"filed\" for purposes of Section 18 of "
    "the Securities Exchange Act of 1934, as amended.",
    "Forward-looking statements involve risks and uncertainties; actual results may differ "
    "materially.",
    "The Company will host a conference call at 8:30 a.m. Eastern Time to discuss the results.",
    "Net sales were ${amt} million, compared with ${amt2} million in the prior-year period.",
    "Diluted earnings per share were ${eps}, and adjusted EBITDA was ${amt} million.",
    "The agreement has an initial term of {yrs} years and may be renewed by mutual consent.",
    "Pursuant to the requirements of the Securities Exchange Act of 1934, the registrant has "
    "duly caused this report to be signed on its behalf.",
    "Operating expenses were {pct}% of revenue, versus {pct2}% a year earlier.",
    "The credit facility bears interest at LIBOR plus {bps} basis points.",
    "Ms. {name} has served as the Company's Chief Financial Officer since {year}.",
    "The Company doesn't expect the transaction to close before the end of the fiscal year; "
    "it's subject to customary closing conditions.",
]
NAMES = ["Alvarez", "Chen", "Okafor", "Schmidt", "Nakamura", "Rossi", "Dubois", "Kowalski",
         "Haddad", "Johansson", "Patel", "O'Neill", "García", "Nguyễn"]


def fill(rng, s):
    return s.format(amt=f"{rng.uniform(5, 9000):,.1f}", amt2=f"{rng.uniform(5, 9000):,.1f}",
                    eps=f"{rng.uniform(-3, 9):.2f}", yrs=rng.randint(2, 15),
                    pct=rng.randint(5, 60), pct2=rng.randint(5, 60), bps=rng.randint(75, 450),
                    name=rng.choice(NAMES), year=rng.randint(1998, 2017))


def filing(rng):
    year = rng.randint(2004, 2018)
    date = f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    company = f"{rng.choice(PREFIX)} {rng.choice(SUFFIX)} {rng.choice(FORM)}"
    size = rng.choice([1, 1, 2, 3, 5, 8, 13, 21, 34])    # paragraphs: short to several thousand tokens
    pos = neg = 0
    guidance = rng.choice([-1, 0, 0, 1])
    out = [
        "UNITED STATES SECURITIES AND EXCHANGE COMMISSION\nWashington, D.C. 20549\n\nFORM 8-K\n",
        "CURRENT REPORT\nPursuant to Section 13 or 15(d) of the Securities Exchange Act of 1934\n",
        f"Date of Report (Date of earliest event reported): {date}\n",
        f"{company.upper()}\n(Exact name of registrant as specified in its charter)\n",
        f"{rng.choice(STATES)}    001-{rng.randint(10000, 39999)}    "
        f"{rng.randint(10, 99)}-{rng.randint(1000000, 9999999)}\n",
        f"Principal executive offices: {rng.choice(CITIES)}\n",
    ]
    items = rng.sample(ITEMS, rng.randint(1, 3))
    for num, title in sorted(items):
        out.append(f"\nItem {num} {title}.\n")
        for _ in range(max(1, size // len(items))):
            sent = [fill(rng, rng.choice(NEUTRAL)) for _ in range(rng.randint(2, 5))]
            if rng.random() < 0.6:
                p = rng.choice(POSITIVE)
                pos += 1
                sent.insert(rng.randrange(len(sent) + 1),
                            f"{company.split()[0]} reported {p} in the period.")
            if rng.random() < 0.5:
                n = rng.choice(NEGATIVE)
                neg += 1
                sent.insert(rng.randrange(len(sent) + 1),
                            f"Management noted {n} affecting results.")
            out.append(" ".join(sent) + "\n")
    if guidance > 0:
        out.append("\nThe Company raised its full-year outlook.\n")
    elif guidance < 0:
        out.append("\nThe Company lowered its full-year outlook.\n")
    else:
        out.append("\nThe Company reaffirmed its full-year outlook.\n")
    out.append(f"\nSIGNATURE\n{company}\nBy: /s/ {rng.choice(NAMES)}\nDate: {date}\n")
    z = 0.9 * (pos - neg) + 0.4 * guidance
    label = round(1.0 / (1.0 + math.exp(-z)), 4)
    return {"text": "".join(out), "label": label, "date": date, "company": company}


def filings(n, seed):
    rng = random.Random(seed)
    return [filing(rng) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    for r in filings(a.n, a.seed):
        sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
