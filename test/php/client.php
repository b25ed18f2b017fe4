<?php
// Plays a legacy PHP caller against a running gateway: fetches the same call
// in every result_type with curl (gzip on, as those callers do), decodes each
// the way such scripts do, and checks that they all hold the same data.
// Fields that differ between two calls by design are set aside.
// The wholesale shop id is not given: as spec 4.2 says, the caller reads it
// from the wholesale item detail (seller_info.sid) and passes it to peerbuy.
// Usage: php client.php BASE KEY SECRET RETAIL_NUM_IID WHOLESALE_NUM_IID

[$_, $base, $key, $secret, $retailId, $wholesaleId] = $argv;
$perCall = ['request_id', 'execution_time', 'server_time', 'server_memory', 'api_info', 'cache'];

function fetch(string $url): string {
    $ch = curl_init($url);
    curl_setopt_array($ch, [CURLOPT_RETURNTRANSFER => true, CURLOPT_ENCODING => 'gzip', CURLOPT_TIMEOUT => 20]);
    $body = curl_exec($ch);
    if ($body === false) throw new Exception('curl: ' . curl_error($ch));
    curl_close($ch);
    return $body;
}

require __DIR__ . '/xml-mapping.php';

$wholesaleDetail = "$base/wholesale/item_get/?" . http_build_query(['key' => $key, 'secret' => $secret, 'num_iid' => $wholesaleId]);
$sid = json_decode(fetch($wholesaleDetail), true, 512, JSON_THROW_ON_ERROR)['item']['seller_info']['sid'];
echo "wholesale sid: $sid\n";

$calls = [
    'wholesale item_get' => $wholesaleDetail,
    'item_get' => "$base/retail/item_get/?" . http_build_query(['key' => $key, 'secret' => $secret, 'num_iid' => $retailId, 'is_promotion' => '1']),
    'peerbuy' => "$base/wholesale/item_search_peerbuy/?" . http_build_query(['key' => $key, 'secret' => $secret, 'num_iid' => $wholesaleId, 'sid' => $sid]),
    'not found' => "$base/retail/item_get/?" . http_build_query(['key' => $key, 'secret' => $secret, 'num_iid' => '1']),
    'bad secret' => "$base/wholesale/item_search_peerbuy/?" . http_build_query(['key' => $key, 'secret' => 'wrong', 'num_iid' => '1', 'sid' => '1']),
];
$failures = [];
foreach ($calls as $name => $url) {
    $serialized = unserialize(fetch("$url&result_type=serialize"), ['allowed_classes' => false]);
    $json = json_decode(fetch("$url&result_type=json"), true, 512, JSON_THROW_ON_ERROR);
    $jsonu = json_decode(fetch("$url&result_type=jsonu"), true, 512, JSON_THROW_ON_ERROR);
    $exported = eval('return ' . fetch("$url&result_type=var_export") . ';');
    $xml = xml_map(simplexml_load_string(fetch("$url&result_type=xml")));
    foreach ([&$serialized, &$json, &$jsonu, &$exported, &$xml] as &$v) foreach ($perCall as $k) unset($v[$k]);
    unset($v);
    if (!is_array($serialized) || !isset($serialized['error_code'])) $failures[] = "$name: serialize did not decode to a response";
    // JSON cannot tell 30 from 30.0, so it is compared loosely; the PHP formats strictly.
    if ($json != $serialized) $failures[] = "$name: json_decode != unserialize";
    if ($jsonu != $json) $failures[] = "$name: jsonu != json";
    if ($exported !== $serialized) $failures[] = "$name: var_export !== unserialize";
    if ($xml !== $serialized) $failures[] = "$name: xml !== unserialize";
    echo "$name: error_code {$serialized['error_code']}\n";
}
if ($failures) { fwrite(STDERR, implode("\n", $failures) . "\n"); exit(1); }
echo "all formats agree\n";
