// The official openai Node client calls client.responses.create as a user would; prints what it parsed as JSON.
//
//   LLMGW_OPENAI_NODE=file:///.../openai/index.mjs node responses.mjs BASE_URL MODEL CASE [MAX_OUTPUT_TOKENS]
//
// CASE is plain, stream, tool (a function tool round trip), tool_stream (a streamed function call) or json (a json_schema text.format, parsed by the
// client's responses.parse).  tests/router/test_openai_node.py asserts on the JSON and on an empty stderr.
const { default: OpenAI } = await import(process.env.LLMGW_OPENAI_NODE);

const [baseURL, model, which, most] = process.argv.slice(2);
// The plain and streamed cases' max_output_tokens: a real model may otherwise talk until its context is full.
const limit = most ? { max_output_tokens: Number(most) } : {};
const client = new OpenAI({ baseURL, apiKey: "sk-test", maxRetries: 0, timeout: 30_000 });

const WEATHER = {
  type: "function",
  name: "get_weather",
  description: "The weather in a city.",
  parameters: {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  },
  strict: true,
};

const CITY = {
  type: "json_schema",
  name: "city",
  strict: true,
  schema: {
    type: "object",
    properties: { name: { type: "string" }, population: { type: "integer" } },
    required: ["name", "population"],
    additionalProperties: false,
  },
};

// The text of the output's messages: what the client's output_text is on a response it parsed whole, and what a
// streamed event's response (which the client does not add output_text to) holds.
function textOf(response) {
  return response.output
    .filter((item) => item.type === "message")
    .flatMap((item) => item.content)
    .filter((part) => part.type === "output_text")
    .map((part) => part.text)
    .join("");
}

function summary(response) {
  return {
    id: response.id,
    object: response.object,
    status: response.status,
    model: response.model,
    output_types: response.output.map((item) => item.type),
    output_text: response.output_text ?? null,
    text: textOf(response),
    usage: response.usage,
    // The client's own reading of the answer's X-Request-Id, for a user's bug report.
    request_id: response._request_id ?? null,
  };
}

const cases = {
  async plain() {
    return summary(await client.responses.create({
      model, input: "the quick brown fox", max_output_tokens: 16, ...limit,
    }));
  },

  async stream() {
    const stream = await client.responses.create({
      model, instructions: "Answer briefly.", input: "one two three", stream: true, ...limit,
    });
    const types = [];
    let text = "";
    let completed = null;
    const sequence = [];
    for await (const event of stream) {
      types.push(event.type);
      sequence.push(event.sequence_number);
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.completed" || event.type === "response.incomplete") {
        completed = summary(event.response);
      }
    }
    // The helper that accumulates the events into a Response checks their order as it goes.
    const helper = client.responses.stream({ model, input: "one two three", ...limit });
    const final = summary(await helper.finalResponse());
    return { types, sequence, text, completed, final };
  },

  async tool() {
    const input = [{ role: "user", content: "What is the weather in Paris?" }];
    const first = await client.responses.create({ model, input, tools: [WEATHER] });
    const call = first.output.find((item) => item.type === "function_call");
    if (!call) return { first: summary(first), call: null };
    const second = await client.responses.create({
      model,
      tools: [WEATHER],
      input: [...input, ...first.output,
        { type: "function_call_output", call_id: call.call_id, output: JSON.stringify({ celsius: 21 }) }],
    });
    return {
      first: summary(first),
      call: { type: call.type, name: call.name, arguments: call.arguments, call_id: call.call_id, id: call.id },
      second: summary(second),
    };
  },

  async tool_stream() {
    // The helper's accumulator checks every event's output_index against what it was told before.
    const stream = client.responses.stream({ model, input: "What is the weather in Paris?", tools: [WEATHER] });
    const types = [];
    stream.on("event", (event) => types.push(event.type));
    const final = await stream.finalResponse();
    const call = final.output.find((item) => item.type === "function_call");
    return { types, final: summary(final), call: call && { name: call.name, arguments: call.arguments } };
  },

  async json() {
    const response = await client.responses.parse({ model, input: "A city, please.", text: { format: CITY } });
    return { ...summary(response), output_parsed: response.output_parsed };
  },
};

try {
  console.log(JSON.stringify(await cases[which]()));
} catch (error) {
  // The test prints this: the client's own words for what it could not parse.
  console.log(JSON.stringify({ error: `${error.constructor.name}: ${error.message}`, status: error.status ?? null }));
  process.exitCode = 2;
}
