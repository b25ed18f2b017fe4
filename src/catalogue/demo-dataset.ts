/**
 * The demo catalogue, generated from a fixed seed: the same records on every
 * machine and every run. Records are in the import format (catalogue-record.ts),
 * so seeding the demo and importing a user's file take the same path.
 */

const seed = 20250908;

function mulberry32(state: number): () => number {
  return () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Property {
  readonly pid: number;
  readonly name: string;
  readonly values: readonly (readonly [vid: number, name: string])[];
}

const colours: Property = {
  pid: 1627207,
  name: "颜色分类",
  values: [
    [28320, "白色"], [28341, "黑色"], [28326, "红色"], [28338, "蓝色"], [28335, "绿色"],
    [28332, "浅灰色"], [3232483, "军绿色"], [28340, "深蓝色"], [3232480, "粉红色"], [28331, "卡其色"],
  ],
};
const clothingSizes: Property = {
  pid: 20509,
  name: "尺码",
  values: [[28314, "S"], [28315, "M"], [28316, "L"], [28317, "XL"], [6145171, "2XL"], [115781, "3XL"]],
};
const shoeSizes: Property = {
  pid: 20549,
  name: "鞋码",
  values: [[28383, "36"], [28384, "37"], [28385, "38"], [28386, "39"], [28387, "40"], [28388, "41"], [28389, "42"], [28390, "43"]],
};
const capacities: Property = {
  pid: 122216347,
  name: "容量",
  values: [[3271595, "350ml"], [3271596, "500ml"], [3271597, "750ml"], [3271598, "1000ml"]],
};
const packages: Property = {
  pid: 5919063,
  name: "套餐类型",
  values: [[6536025, "官方标配"], [3266779, "套餐一"], [3266781, "套餐二"]],
};

interface Kind {
  readonly noun: string;
  readonly rootCatId: string;
  readonly cid: string;
  readonly price: readonly [min: number, max: number];
  readonly properties: readonly Property[];
  readonly material: readonly string[];
  readonly weight: string;
}

const kinds: readonly Kind[] = [
  { noun: "连衣裙", rootCatId: "16", cid: "50010850", price: [59, 399], properties: [colours, clothingSizes], material: ["棉", "雪纺", "真丝"], weight: "0.4" },
  { noun: "纯棉T恤", rootCatId: "30", cid: "50000436", price: [19, 129], properties: [colours, clothingSizes], material: ["棉", "莫代尔"], weight: "0.25" },
  { noun: "运动鞋", rootCatId: "50011740", cid: "50012043", price: [89, 699], properties: [colours, shoeSizes], material: ["网布", "真皮", "飞织"], weight: "0.9" },
  { noun: "保温杯", rootCatId: "50016349", cid: "50016355", price: [29, 259], properties: [colours, capacities], material: ["316不锈钢", "304不锈钢"], weight: "0.45" },
  { noun: "蓝牙耳机", rootCatId: "50008090", cid: "50005050", price: [49, 999], properties: [colours, packages], material: ["ABS", "铝合金"], weight: "0.15" },
  { noun: "双肩包", rootCatId: "50006842", cid: "50012010", price: [69, 459], properties: [colours], material: ["尼龙", "牛津布", "帆布"], weight: "0.8" },
  { noun: "羽绒服", rootCatId: "30", cid: "50011167", price: [299, 1899], properties: [colours, clothingSizes], material: ["白鸭绒", "白鹅绒"], weight: "1.1" },
  { noun: "牛仔裤", rootCatId: "30", cid: "3035", price: [79, 399], properties: [colours, clothingSizes], material: ["棉", "棉混纺"], weight: "0.6" },
  { noun: "电饭煲", rootCatId: "50012100", cid: "50002894", price: [159, 1299], properties: [colours, packages], material: ["合金", "陶瓷内胆"], weight: "3.2" },
  { noun: "口红", rootCatId: "50010788", cid: "50010808", price: [39, 399], properties: [colours], material: ["滋润型"], weight: "0.05" },
];

const adjectives = ["2025新款", "韩版", "宽松", "加厚", "轻薄", "高腰", "复古", "ins风", "简约", "百搭", "大容量", "防水", "男女同款", "夏季", "秋冬"];
const brands = ["花间集", "北辰", "云栖", "木子家", "青禾", "星河", "拾光", "南山"];
const places = ["浙江 杭州", "广东 广州", "广东 深圳", "江苏 苏州", "福建 泉州", "浙江 义乌", "上海", "山东 青岛"];
const shopWords = ["旗舰店", "官方店", "精品店", "工厂店", "专营店"];
const highlights = ["🔥爆款", "✨新品", "包邮", "【官方正品】", "\"限时\"特价", "买一送一/赠品"];

function pick<T>(rng: () => number, list: readonly T[]): T {
  return list[Math.floor(rng() * list.length)]!;
}

function pickSome<T>(rng: () => number, list: readonly T[], min: number, max: number): T[] {
  const n = Math.min(list.length, min + Math.floor(rng() * (max - min + 1)));
  const pool = [...list];
  const out: T[] = [];
  while (out.length < n) out.push(pool.splice(Math.floor(rng() * pool.length), 1)[0]!);
  return out;
}

function money(n: number): string {
  return n.toFixed(2);
}

function digits(rng: () => number, n: number): string {
  let s = String(1 + Math.floor(rng() * 9));
  while (s.length < n) s += String(Math.floor(rng() * 10));
  return s;
}

const retailCount = 320;
const wholesaleCount = 120;

/** Every `unobtainableEvery`-th retail item cannot be obtained (item_get answers 2000). */
const unobtainableEvery = 25;
/** Every `noPeersEvery`-th wholesale item has no peer-viewed items (answers 2000). */
const noPeersEvery = 10;

/** Where a wholesale item's detail record differs from a retail one: its id, its shop and its page. */
interface WholesaleIds {
  readonly numIid: string;
  readonly sid: string;
}

/**
 * An item detail record (spec 2.3). A retail item draws its id and shop from
 * `rng`; a wholesale item is given them (`wholesale`), so its
 * `seller_info.sid` is the shop id its peer-viewed record is keyed by. Both
 * draw the same values from `rng` either way.
 */
function detailRecord(rng: () => number, index: number, wholesale?: WholesaleIds): Record<string, unknown> {
  const kind = kinds[index % kinds.length]!;
  const brand = pick(rng, brands);
  const drawnId = String(600000000000 + index * 7919 + Math.floor(rng() * 7000));
  const sellerId = digits(rng, 10);
  const drawnShop = digits(rng, 9);
  const numIid = wholesale?.numIid ?? drawnId;
  const shopId = wholesale?.sid ?? drawnShop;
  const shopName = `${brand}${pick(rng, shopWords)}`;
  const title = [index % 7 === 0 ? pick(rng, highlights) : "", brand, ...pickSome(rng, adjectives, 2, 2), kind.noun, pick(rng, kind.material)].join("");
  const chosen = kind.properties.map((p) => ({ property: p, values: pickSome(rng, p.values, 2, p === colours ? 5 : 4) }));
  const base = kind.price[0] + Math.floor(rng() * (kind.price[1] - kind.price[0]));
  const original = base + 0.9;
  const promo = Math.round(original * (0.6 + rng() * 0.3) * 10) / 10;
  const img = (n: number) => `//img.example-cdn.com/bao/uploaded/i${1 + (n % 4)}/${sellerId}/O1CN01${digits(rng, 8)}_!!${sellerId}.jpg`;

  const propsName: string[] = [];
  const propertyAlias: string[] = [];
  const propsList: Record<string, string> = {};
  const propsImg: Record<string, string> = {};
  const propImgs: { properties: string; url: string }[] = [];
  for (const { property, values } of chosen) {
    for (const [vid, name] of values) {
      const code = `${property.pid}:${vid}`;
      propsName.push(`${code}:${property.name}:${name}`);
      propertyAlias.push(`${code}:${name}`);
      propsList[code] = `${property.name}:${name}`;
      if (property === colours) {
        const url = img(vid);
        propsImg[code] = url;
        propImgs.push({ properties: code, url });
      }
    }
  }

  // Every combination of the chosen values is a SKU.
  let combos: (readonly [Property, readonly [number, string]])[][] = [[]];
  for (const { property, values } of chosen) combos = combos.flatMap((c) => values.map((v) => [...c, [property, v] as const]));
  let totalQuantity = 0;
  const skus = combos.map((combo) => {
    const quantity = rng() < 0.15 ? 0 : Math.floor(rng() * 500);
    totalQuantity += quantity;
    const bump = Math.floor(rng() * 3) * 10;
    return {
      price: money(promo + bump),
      orginal_price: money(original + bump),
      properties: combo.map(([p, [vid]]) => `${p.pid}:${vid}`).join(";"),
      properties_name: combo.map(([p, [vid, name]]) => `${p.pid}:${vid}:${p.name}:${name}`).join(";"),
      quantity: String(quantity),
      sku_id: digits(rng, 13),
    };
  });

  const sold = Math.floor(rng() * 20000);
  const longDescription = index % 5 === 0;
  const desc = longDescription
    ? Array.from({ length: 12 }, (_, i) => `<p><img src="${img(i)}" alt="${kind.noun}细节图${i + 1}"/></p><p>${title} 细节展示：做工精细，${pick(rng, kind.material)}材质，舒适耐用。</p>`).join("")
    : "";

  return {
    num_iid: numIid,
    title,
    desc_short: "",
    price: promo,
    total_price: promo,
    suggestive_price: 0,
    orginal_price: money(original),
    nick: shopName,
    num: String(totalQuantity),
    min_num: 1,
    detail_url: wholesale ? `https://detail.example.com/offer/${numIid}.html` : `https://item.example.com/item.htm?id=${numIid}`,
    pic_url: img(0),
    brand,
    brandId: digits(rng, 8),
    rootCatId: kind.rootCatId,
    cid: kind.cid,
    crumbs: [],
    created_time: "",
    modified_time: "",
    delist_time: "",
    desc,
    item_imgs: [0, 1, 2, 3, 4].slice(0, 2 + Math.floor(rng() * 4)).map((n) => ({ url: img(n + 10) })),
    item_weight: kind.weight,
    item_size: "",
    location: pick(rng, places),
    post_fee: "0.00",
    express_fee: rng() < 0.8 ? "0.00" : "10.00",
    ems_fee: "0.00",
    shipping_to: "",
    has_discount: "false",
    video: [],
    is_virtual: "false",
    sample_id: "",
    is_promotion: "true",
    props_name: propsName.join(";"),
    prop_imgs: { prop_img: propImgs },
    property_alias: propertyAlias.join(";"),
    props: [
      { name: "品牌", value: brand },
      { name: "材质", value: pick(rng, kind.material) },
      ...chosen.map(({ property, values }) => ({ name: property.name, value: values.map(([, n]) => n).join(",") })),
      { name: "产地", value: "中国大陆" },
    ],
    total_sold: String(sold),
    skus: { sku: skus },
    seller_id: sellerId,
    sales: String(Math.floor(sold / 10)),
    shop_id: shopId,
    props_list: propsList,
    seller_info: {
      title: shopName,
      shop_name: shopName,
      nick: shopName,
      sid: shopId,
      zhuy: wholesale ? `//${shopId}.b2b.example.com` : `//shop${shopId}.example.com`,
      shop_type: rng() < 0.3 ? "B" : "C",
      user_num_id: sellerId,
    },
    tmall: rng() < 0.3 ? "true" : "false",
    error: "",
    warning: "",
    favcount: String(Math.floor(rng() * 5000)),
    fanscount: String(Math.floor(rng() * 100000)),
    url_log: [],
    shop_item: [],
    relate_items: [],
    stuff_status: "",
    rate_grade: "",
    shopinfo: { shop_name: shopName, shop_id: shopId },
    data_from: "embedded",
    method: "",
    promo_type: null,
    props_img: propsImg,
  };
}

function peerItem(rng: () => number, index: number): Record<string, unknown> {
  const kind = kinds[Math.floor(rng() * kinds.length)]!;
  const numIid = String(610000000000 + index * 104729 + Math.floor(rng() * 100000));
  const price = kind.price[0] * 0.5 + rng() * kind.price[0];
  return {
    num_iid: numIid,
    price: money(price),
    pic_url: `https://cbu01.example-cdn.com/img/ibank/O1CN01${digits(rng, 10)}.jpg`,
    title: `${pick(rng, adjectives)}${kind.noun}批发${pick(rng, kind.material)}厂家直销`,
    sales: String(Math.floor(rng() * 50000)),
    seller_id: digits(rng, 10),
    detail_url: `https://detail.example.com/offer/${numIid}.html`,
  };
}

/** The whole demo catalogue, in import-record form. */
export function demoRecords(): Record<string, unknown>[] {
  const rng = mulberry32(seed);
  const records: Record<string, unknown>[] = [];
  for (let i = 0; i < retailCount; i++) {
    records.push({ kind: "item_detail", item: detailRecord(rng, i), obtainable: i % unobtainableEvery !== unobtainableEvery - 1 });
  }
  for (let i = 0; i < wholesaleCount; i++) {
    const numIid = String(620000000000 + i * 15485863);
    const sid = `b2b-${digits(rng, 10)}`;
    const peers = i % noPeersEvery === noPeersEvery - 1 ? [] : Array.from({ length: 4 + Math.floor(rng() * 8) }, (_, j) => peerItem(rng, i * 20 + j));
    records.push({ kind: "peer_viewed", num_iid: numIid, sid, item: peers });
  }
  // Every wholesale item's detail record, from its own stream so the records above never change.
  const wholesaleRng = mulberry32(seed + 1);
  records
    .filter((r) => r.kind === "peer_viewed")
    .forEach((peers, i) => {
      const ids = { numIid: peers.num_iid as string, sid: peers.sid as string };
      records.push({ kind: "item_detail", catalogue: "wholesale", item: detailRecord(wholesaleRng, i, ids), obtainable: true });
    });
  return records;
}

/** Ids for examples: the first obtainable item and the first wholesale item with peers. */
export function demoExampleIds(records = demoRecords()): { retailNumIid: string; wholesaleNumIid: string; wholesaleSid: string } {
  const retail = records.find((r) => r.kind === "item_detail" && r.obtainable === true)!;
  const wholesale = records.find((r) => r.kind === "peer_viewed" && (r.item as unknown[]).length > 0)!;
  return {
    retailNumIid: (retail.item as { num_iid: string }).num_iid,
    wholesaleNumIid: wholesale.num_iid as string,
    wholesaleSid: wholesale.sid as string,
  };
}

/**
 * A catalogue of `n` distinct retail items for load and memory tests: the
 * demo's detail records under new ids from `firstId` on, each title
 * numbered, as import records. Yielded one by one, so a million of them
 * never sit in memory at once.
 */
export function* demoDetailCopies(n: number, firstId: number): Generator<Record<string, unknown>> {
  const details = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable && (r.catalogue ?? "retail") === "retail");
  for (let i = 0; i < n; i++) {
    const r = structuredClone(details[i % details.length]!) as { item: { num_iid: string; title: string } };
    r.item.num_iid = String(firstId + i);
    r.item.title = `${r.item.title} ${i}`;
    yield r as unknown as Record<string, unknown>;
  }
}
