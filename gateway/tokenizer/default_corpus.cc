// DefaultTrainingCorpus: original text written for Ferry's demo tokenizers. It
// only has to give BPE a realistic mix of scripts, code, digits and symbols.
#include <string>

#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::tokenizer {
namespace {

constexpr std::string_view kEnglishProse = R"CORPUS(
The ferry left the harbour at seven in the morning, as it had every day for the last forty years. Nobody on board
remembered a time when it had been late, and the captain liked to say that the tide kept better time than any clock.
On the lower deck, a group of students argued about whether the sea was blue because of the sky or because of the
water itself. One of them, a quiet girl with a notebook full of diagrams, said it was both, and that the answer
depended on how deep you looked. The others laughed, but they wrote it down anyway.

A language model does not read words the way people do. It reads tokens: small pieces of text that a tokenizer cuts
from the input. Common words become a single token, rare words are split into several, and every possible byte has a
token of its own, so that no input is ever impossible to represent. The cutting follows a list of merges learned from
a corpus; the most frequent pairs of symbols were merged first, and the order of that list is the whole secret.

When a request arrives at the gateway, it is tokenised, placed in a queue, and scheduled onto a worker. The scheduler
decides how many tokens each request may process in the next step. Some requests are still reading their prompt;
others are generating one token at a time. A good scheduler keeps the accelerator busy without letting any request
wait too long. It's a balancing act, and it's never finished: there's always another trade-off to make.

"Where are we going?" asked the boy. "Across," said his grandmother, "and then back again." He thought about that for
a while. "Isn't that the same as staying here?" She smiled. "Only if you don't look out of the window."

I've often wondered why we'd rather wait for the next ferry than walk the long way round. They're both slow; we'll
arrive at the same time. But the ferry gives you something the road doesn't: a moment in which nothing is expected
of you. You can't hurry the water. You'd be surprised how many people find that restful, and how many find it
unbearable.

Memory is the scarce resource in serving. Every token a model has seen leaves keys and values behind in a cache, and
that cache grows with every step. Blocks of a fixed size make it manageable: a request owns a list of blocks, the
blocks are returned when it finishes, and two requests that share a prefix can share the blocks that hold it. When
memory runs out, someone has to wait, and the question of who is the heart of the scheduling problem.

The weather report promised light rain in the afternoon, clearing by evening, with a moderate breeze from the west.
It was wrong on every count. By three o'clock the wind had turned north-east and the rain came sideways, and the
harbour master closed the pier for an hour. The ferry waited at its moorings, rocking gently, its lights on.

Good software is mostly made of small, boring pieces that each do one thing and say clearly what they expect. A
function that takes a struct of options is easier to call correctly than one that takes seven booleans. A comment
that explains why is worth more than one that repeats what. Tests that check the whole timeline catch the bugs that
tests of single steps miss. None of this is new; all of it is easy to forget on a Friday afternoon.

She opened the letter slowly. It was short: three lines, unsigned, in handwriting she didn't recognise. "The garden
is yours if you want it. The key is under the blue pot. Please water the lemon tree." She read it twice, then a third
time, and then she went to find her coat.

Numbers appear everywhere in ordinary text: 3 apples, 12 eggs, 2024-05-17, 09:30, 1,000,000 users, 99.9% uptime,
$4.50, -273.15 degrees, version 2.1.0, room 404, page 17 of 230, a ratio of 16:9, and the answer, as always, is 42.
Phone numbers like +1 (555) 010-9999 and postcodes like SW1A 1AA are numbers too, in their way.

THE END OF THE CHAPTER. The beginning of another. Some headings shout; some whisper. Title Case Is Common In Headings,
while sentence case is common in body text. ALL CAPS is for warnings: DO NOT OPEN THE DOOR WHILE THE FERRY IS MOVING.
)CORPUS";

constexpr std::string_view kCode = R"CORPUS(
#include <cstdint>
#include <vector>

// Returns the index of the first element not less than value.
template <typename T>
size_t LowerBound(const std::vector<T>& items, const T& value) {
  size_t lo = 0, hi = items.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (items[mid] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

struct BlockTable {
  std::vector<int32_t> block_ids;
  int32_t num_tokens = 0;
  bool is_full(int32_t block_size) const { return num_tokens % block_size == 0; }
};

def softmax(logits, temperature=1.0):
    """Numerically stable softmax over a list of floats."""
    scaled = [x / temperature for x in logits]
    peak = max(scaled)
    exps = [math.exp(x - peak) for x in scaled]
    total = sum(exps)
    return [e / total for e in exps]


class Scheduler:
    def __init__(self, max_num_seqs=256, max_num_batched_tokens=8192):
        self.waiting = collections.deque()
        self.running = []
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens

    def plan(self, budget):
        scheduled = []
        for request in list(self.running):
            if budget <= 0:
                break
            scheduled.append((request.id, 1))
            budget -= 1
        return scheduled

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: count PATH")?;
    let text = std::fs::read_to_string(path)?;
    println!("{} lines, {} words", text.lines().count(), text.split_whitespace().count());
    Ok(())
}

func (s *Server) Generate(ctx context.Context, req *pb.GenerateRequest) (*pb.GenerateResponse, error) {
	if req.GetPrompt() == "" {
		return nil, status.Error(codes.InvalidArgument, "empty prompt")
	}
	ids, err := s.tokenizer.Encode(req.GetPrompt())
	if err != nil {
		return nil, err
	}
	return &pb.GenerateResponse{TokenIds: ids}, nil
}

SELECT r.id, r.arrival_ms, COUNT(t.id) AS num_tokens
FROM requests r LEFT JOIN tokens t ON t.request_id = r.id
WHERE r.finished = FALSE AND r.arrival_ms > 1715900000000
GROUP BY r.id ORDER BY r.arrival_ms ASC LIMIT 100;

{"model": "qwen2-demo", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64, "stream": true}
{"id": "cmpl-7f3a", "object": "text_completion", "choices": [{"index": 0, "text": " Hi there", "finish_reason": null}]}

$ cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build -j8
$ ./build/bin/ferry-gateway --port 8000 --max-num-seqs 64 --block-size 16 --enable-prefix-caching
$ curl -s http://localhost:8000/v1/completions -d '{"prompt": "2 + 2 =", "max_tokens": 4}' | jq .

<html>
  <head><title>Ferry status</title></head>
  <body class="dashboard">
    <p id="queue">Waiting: 3 &middot; Running: 12 &middot; Free blocks: 4,096</p>
  </body>
</html>

x = [i ** 2 for i in range(10) if i % 2 == 0]  # even squares
y = {k: v for k, v in zip("abc", (1, 2, 3))}
assert sorted(y.items()) == [("a", 1), ("b", 2), ("c", 3)], "dict comprehension"
while (n != 1) { n = (n % 2 == 0) ? n / 2 : 3 * n + 1; ++steps; }
a[i][j] += b[i][k] * c[k][j];  // O(n^3), fine for n <= 64
const auto [it, inserted] = cache.try_emplace(key, std::move(value));
)CORPUS";

constexpr std::string_view kChinese = R"CORPUS(
清晨七点，渡船准时离开港口。四十年来，它每天都是这样，从来没有晚点过。船长常说，潮水比任何钟表都准时。
下层甲板上，几个学生在争论大海为什么是蓝色的：是因为天空，还是因为海水本身？一个安静的女孩说，两者都有，
答案取决于你看得多深。其他人笑了，但还是把这句话记了下来。

语言模型读文字的方式和人不一样。它读的是“词元”，也就是分词器从输入中切出来的小片段。常见的词是一个词元，
罕见的词会被拆成几个，每一个字节都有自己的词元，所以任何输入都能被表示出来。切分的规则来自语料库中学到的
合并列表：最常见的相邻符号最先被合并，这个列表的顺序就是全部的秘密。

请求到达网关以后，先被分词，然后进入队列，再被调度到某个工作节点上。调度器决定每个请求在下一步可以处理多少
个词元。有的请求还在读提示词，有的请求正在一个一个地生成新词元。好的调度器既要让加速器保持忙碌，又不能让
任何请求等待太久。

今天的天气预报说下午有小雨，傍晚转晴，西风三到四级。结果全错了：三点钟风向转为东北，雨是横着下的，
港务长把码头关闭了一个小时。渡船停在泊位上，轻轻摇晃，灯一直亮着。

她慢慢地打开那封信。信很短，只有三行，没有署名，字迹她不认识。“如果你想要，花园就是你的了。钥匙在蓝色花盆
下面。请给柠檬树浇水。”她读了两遍，又读了第三遍，然后去找她的外套。

数字也常常出现在中文里：三个苹果、十二个鸡蛋、2024年5月17日、上午9点30分、一百万用户、99.9%的可用性、
人民币4.50元、第17页、共230页。问：一加一等于几？答：等于二。
好的软件大多由许多小而朴素的部分组成，每个部分只做一件事，并且清楚地说明它需要什么。
北京、上海、广州、深圳、杭州、成都、武汉、西安、南京、重庆都是中国的大城市。
《论语》有云：“学而时习之，不亦说乎？有朋自远方来，不亦乐乎？”
)CORPUS";

constexpr std::string_view kOtherLanguages = R"CORPUS(
Le bateau quitte le port à sept heures. « Où allons-nous ? » demanda l'enfant. « De l'autre côté », répondit sa
grand-mère. Les élèves discutaient de la couleur de la mer ; personne n'était d'accord, mais tout le monde a noté la
réponse. Ça m'étonne toujours : l'eau paraît bleue, mais dans un verre, elle est transparente.
Die Fähre legt um sieben Uhr ab. Über das Wasser weht ein kühler Wind, und die Möwen schreien. Größere Schiffe
müssen warten, bis die Schleuse geöffnet wird. Grüße aus Köln, München und Düsseldorf!
El transbordador sale a las siete. ¿Adónde vamos? ¡Al otro lado! La niña escribió la respuesta en su cuaderno, junto
a un dibujo del mar, del sol y de una gaviota pequeña. Mañana será otro día.
Паром отходит в семь утра. Капитан говорит, что прилив точнее любых часов. Студенты спорят о цвете моря.
フェリーは朝七時に港を出ます。船長は「潮はどんな時計よりも正確だ」と言います。今日は雨のち晴れでしょう。
ひらがな、カタカナ、漢字が混ざった文章はトークナイザーにとって良い練習になります。
페리는 아침 일곱 시에 항구를 떠납니다. 선장은 조수가 어떤 시계보다 정확하다고 말합니다. 감사합니다!
Το πλοίο φεύγει στις επτά. Η θάλασσα είναι γαλάζια σήμερα. Καλημέρα σας!
العبّارة تغادر الميناء في السابعة صباحًا. البحر هادئ اليوم.
नाव सुबह सात बजे बंदरगाह से निकलती है। आज मौसम अच्छा है।
Tiếng Việt có nhiều dấu: ă, â, ê, ô, ơ, ư, đ, và các thanh điệu như à, á, ả, ã, ạ.
Ångström, façade, naïve, coöperate, résumé, jalapeño, piñata, Zoë, São Paulo, Kraków, Þórr, Øresund, Straße.
)CORPUS";

constexpr std::string_view kSymbolsAndEmoji = R"CORPUS(
Good morning! 😀 The ferry is on time 🚀🚀 and the sea is calm 🌊. Thanks 👍👍🏽👍🏿 — see you tomorrow ✨
Party time 🎉🎉🎉! Family: 👨‍👩‍👧‍👦 Developer: 👩‍💻 Astronaut: 🧑🏾‍🚀 Flags: 🇯🇵 🇫🇷 🇧🇷 🏳️‍🌈 Hearts: ❤️ 💙 💚 🧡
Weather: ☀️ → 🌤️ → 🌧️ → ⛈️. Food: 🍜 🍣 🥐 🍕 ☕. Hands: 👋 👋🏻 👋🏼 👋🏽 👋🏾 👋🏿 🙏 👏
Arrows and math: ← → ↑ ↓ ⇒ ⇔ ∀ ∃ ∈ ∉ ∑ ∏ √ ∞ ≈ ≠ ≤ ≥ ± × ÷ ° µ π Ω ∆ ∫ ∂ ∇ ⊕ ⊗
Currency: $ € £ ¥ ₹ ₩ ₽ ¢ — prices like €12,50 or £3.99 or ¥1,200 or ₹499.
Quotes: "double" 'single' “curly” ‘curly’ «guillemets» „low“ 「corner」 『white』 【lenticular】
Dashes and dots: a-b a–b a—b ... … • · ‧ ※ § ¶ † ‡ © ® ™ № ℃ ℉
Brackets: () [] {} <> ⟨⟩ ⌈⌉ ⌊⌋; operators: == != <= >= && || << >> += -= *= /= %= ^= |= &= -> => :: ...
Markdown: # Heading, ## Subheading, **bold**, *italic*, `code`, [link](https://example.com/path?q=1&r=2#frag)
- item one
- item two
  1. nested
  2. nested again
> a quoted line
| id | name  | score |
|----|-------|------:|
| 1  | alpha |  98.5 |
| 2  | beta  | 87.25 |
Email: someone@example.org, path: /usr/local/lib/libferry.so.1, Windows: C:\Users\ferry\Documents\notes.txt
Tabs	separate	these	fields	and	trailing spaces end this line   
Line with CRLF ending
Another line with CRLF
Blank lines follow.


    Indented by four spaces.
        Indented by eight.
!!! ??? ... --- *** ### $$$ %%% &&& @@@ ~~~ ^^^ ___ +++ === |||
)CORPUS";

constexpr std::string_view kDialogues = R"CORPUS(
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris.<|im_end|>
<|im_start|>user
And of Japan?<|im_end|>
<|im_start|>assistant
Tokyo is the capital of Japan.<|im_end|>
<|im_start|>user
用一句话介绍一下长江。<|im_end|>
<|im_start|>assistant
长江是中国最长的河流，全长约6300公里，流经多个省份，最终注入东海。<|im_end|>
<|im_start|>user
Write a haiku about ferries.<|im_end|>
<|im_start|>assistant
Grey water, slow bell —
the ferry folds the harbour
into afternoon.<|im_end|>
<|im_start|>user
Convert 72 degrees Fahrenheit to Celsius.<|im_end|>
<|im_start|>assistant
(72 - 32) × 5 / 9 = 22.2 °C, so it's about 22 degrees Celsius.<|im_end|>
<|endoftext|>
Q: How many minutes are in a day? A: 24 × 60 = 1440 minutes.
Q: What's 15% of 80? A: 0.15 × 80 = 12.
Q: Is 97 prime? A: Yes; it isn't divisible by 2, 3, 5 or 7, and 11² = 121 > 97.
Q: Spell "necessary". A: n-e-c-e-s-s-a-r-y.
Q: Translate "good night" into Chinese. A: 晚安。
Q: Sort [5, 3, 9, 1]. A: [1, 3, 5, 9].
)CORPUS";

// Generated lines give BPE repeated numbers and dates, as real logs and tables do.
std::string NumberLines() {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    const int value = (i * 7919 + 13) % 100000;
    text += "step " + std::to_string(i) + ": loss=" + std::to_string(value % 1000) + "." +
            std::to_string(value % 97) + ", tokens/s=" + std::to_string(value) + ", date=2024-" +
            std::to_string(1 + i % 12) + "-" + std::to_string(1 + i % 28) + (i % 5 == 0 ? "\r\n" : "\n");
  }
  return text;
}

}  // namespace

std::string_view DefaultTrainingCorpus() {
  static const std::string corpus = [] {
    std::string text;
    for (std::string_view part : {kEnglishProse, kCode, kChinese, kOtherLanguages, kSymbolsAndEmoji, kDialogues}) {
      text += part;
    }
    return text + NumberLines();
  }();
  return corpus;
}

}  // namespace ferry::tokenizer
