"""An agent in another process, as a user would run one beside a training run: it reads the run's
connection file, claims episodes over HTTP, plays each with the OpenAI SDK (two calls, the second
continuing the first) and posts the outcome: the sum of the numbers the model answered.

    python -m tests.support.external_agent CONNECTION_FILE
"""

from __future__ import annotations

import json
import sys

import httpx
import openai


def main(connection_file: str) -> None:
    with open(connection_file) as file:
        connection = json.load(file)
    headers = {"Authorization": f"Bearer {connection['token']}"}
    with httpx.Client(base_url=connection["url"], headers=headers, timeout=30) as http:
        while True:
            claimed = http.post("/episodes/claim", params={"wait_s": 5})
            if claimed.status_code == 204:
                continue
            claimed.raise_for_status()
            episode = claimed.json()
            client = openai.OpenAI(base_url=episode["base_url"], api_key=connection["token"], max_retries=0)
            messages = [{"role": "user", "content": f"count from {episode['instance']['start']}"}]
            numbers = []
            for _ in range(2):
                message = client.chat.completions.create(model="policy", messages=messages).choices[0].message
                numbers.append(int(message.content))
                messages += [message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
            outcome = {"reward": float(sum(numbers)), "success": True}
            http.post(f"/episodes/{episode['episode_id']}/outcome", json=outcome).raise_for_status()


if __name__ == "__main__":
    main(sys.argv[1])
