"""spec_prompts.py - the prompt set of the `spec` bench case: input-grounded requests, whose answers repeat
their input (edit this code, continue this list, quote this passage), and free-form ones, whose answers do not.
Each is a user message for the model's chat template. Also the most any prompt lookup could draft of an answer
(lookup_ceiling), which says whether the drafter or the answers themselves hold speculation back, and what
nxd's lookup drafts when it drafts every step (lookup_steps), which says what its cost rule leaves out."""

GROUNDED = [
    # edit this code
    "Rename the variable `total` to `acc` everywhere in this Python function and show the whole function:\n\n"
    "def total_price(items, tax):\n    total = 0\n    for item in items:\n        total += item.price * item.count\n"
    "    total = total * (1 + tax)\n    return round(total, 2)\n",
    "Add a docstring to this function and show the whole function unchanged otherwise:\n\n"
    "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
    "Convert this JavaScript function to use const instead of var and show the full code:\n\n"
    "function sum(list) {\n  var s = 0;\n  for (var i = 0; i < list.length; i++) {\n    var v = list[i];\n"
    "    s += v;\n  }\n  return s;\n}\n",
    "Fix the typo 'lenght' in this C code and print the corrected code:\n\n"
    "int count(const char *s) {\n    int lenght = 0;\n    while (s[lenght] != 0)\n        lenght++;\n"
    "    return lenght;\n}\n",
    "Reformat this SQL query with one clause per line, keeping every word:\n\n"
    "SELECT name, email, created_at FROM users WHERE active = 1 AND country = 'FR' ORDER BY created_at DESC "
    "LIMIT 20;",
    "Rewrite this HTML list so each item is on its own line:\n\n"
    "<ul><li>Home</li><li>About us</li><li>Products</li><li>Contact</li><li>Careers</li></ul>",
    "Change the port from 8080 to 9090 in this config file and show the whole file:\n\n"
    "server:\n  host: 0.0.0.0\n  port: 8080\n  workers: 4\nlogging:\n  level: info\n  file: /var/log/app.log\n",
    # continue this list
    "Continue this list up to 15:\n1. one\n2. two\n3. three\n4. four\n5. five\n6. six\n7. seven\n",
    "Here are the days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. "
    "Write them again, one per line, numbered.",
    "List these fruits again in the same order, one per line: apple, banana, cherry, date, elderberry, fig, "
    "grape, honeydew, kiwi, lemon.",
    "Copy this shopping list and add milk at the end:\n- eggs\n- bread\n- butter\n- cheese\n- tomatoes\n"
    "- onions\n- rice\n",
    "Repeat the months of the year from January to December, separated by commas.",
    "Continue the pattern: a1 b2 c3 d4 e5 f6 g7 h8",
    # quote this passage
    "Passage: The mitochondrion is the powerhouse of the cell. It produces energy through cellular "
    "respiration and has its own DNA, which is inherited from the mother.\n\nQuote the passage word for word.",
    "Passage: Paris is the capital and most populous city of France. It is located on the Seine River, in the "
    "north of the country.\n\nWhat river is Paris on? Answer by quoting the sentence that says so.",
    "Text: The quick brown fox jumps over the lazy dog. The dog does not move. The fox runs into the "
    "forest.\n\nRepeat the text exactly.",
    "Here is a sentence: Water boils at 100 degrees Celsius at sea level. Write the sentence again three "
    "times.",
    "Passage: The Great Wall of China is a series of fortifications built across the northern borders of "
    "ancient Chinese states to protect against nomadic groups.\n\nQuote the passage, then say in one word "
    "what it is about.",
    "Copy this address exactly:\nJohn Smith\n42 Baker Street\nLondon NW1 6XE\nUnited Kingdom",
    "Email: Hi team, the meeting is moved to Thursday at 3 pm in room 204. Please bring your reports. "
    "Thanks, Anna.\n\nRepeat the email exactly as written.",
]

FREE = [
    "Write a short story about a dragon who learns to cook.",
    "What are the benefits of regular exercise?",
    "Explain how a rainbow forms.",
    "Give me three ideas for a birthday party.",
    "Why is the sky blue?",
]


def lookup_ceiling(prompt, answer, k, longest=8):
    """(decode steps, tokens) of greedy `answer` (after `prompt`, both token ids) with the best drafts any
    prompt lookup could make: at each step, of every earlier occurrence of the last n tokens (n = 1 ..
    longest), the one whose next tokens stay right the longest, cut to the right ones and to k; a step emits
    them and the token after. Nothing rejected is drafted, so no lookup drafter takes fewer steps. The first
    answer token comes from the prompt's step and is not counted, as in the decode rates."""
    hist = list(prompt) + list(answer[:1])
    pos, steps = 1, 0
    while pos < len(answer):
        best = 0
        for n in range(1, min(longest, len(hist) - 1) + 1):
            suf = hist[-n:]
            for i in range(len(hist) - n):
                if hist[i:i + n] != suf:
                    continue
                run = 0
                while (run < k and i + n + run < len(hist) and pos + run < len(answer)
                       and hist[i + n + run] == answer[pos + run]):
                    run += 1
                best = max(best, run)
        hist += answer[pos:pos + best + 1]
        pos += best + 1
        steps += 1
    return steps, len(answer) - 1


def lookup_steps(prompt, answer, k, n_max=3):
    """(decode steps, tokens) of greedy `answer` with daemon/spec.c's lookup drafting at every step, whatever
    its drafts cost: the tokens after the latest earlier occurrence of the last n = n_max .. 1 tokens, up to
    k; a step emits the right ones and the token after. Counted as lookup_ceiling counts."""
    hist = list(prompt) + list(answer[:1])
    pos, steps = 1, 0
    while pos < len(answer):
        draft = []
        for n in range(n_max, 0, -1):
            if len(hist) <= n:
                continue
            suf = hist[-n:]
            i = next((i for i in range(len(hist) - n - 1, -1, -1) if hist[i:i + n] == suf), -1)
            if i >= 0:
                draft = hist[i + n:i + n + k]
                break
        run = 0
        while run < len(draft) and pos + run < len(answer) and draft[run] == answer[pos + run]:
            run += 1
        hist += answer[pos:pos + run + 1]
        pos += run + 1
        steps += 1
    return steps, len(answer) - 1
