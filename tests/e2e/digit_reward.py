"""Dense test reward for e2e runs on the random tiny model: the fraction of digit characters.

The shared grader gives a random model 0 everywhere, so GRPO advantages (and gradients)
would be zero and a weight-sync test could not fail; this reward has variance from step 1.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    digits = sum(ch.isdigit() for ch in solution_str)
    return {"score": digits / max(1, len(solution_str)), "acc": float(solution_str.strip() == ground_truth)}
