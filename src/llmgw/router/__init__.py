"""The OpenAI router: admission, scoring and a streaming relay in front of the engines."""
