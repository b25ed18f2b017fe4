<?php
// PHP as the oracle for the legacy formats. Reads a corpus of typed values
// (tagged JSON, so no JSON decoding guesses between {} and [], int and
// float), builds each as the PHP array it stands for, and prints what PHP's
// own encoders write for it, plus whether our XML for it reads back equal
// through SimpleXML under the documented mapping.

function build(array $node) {
    switch (array_key_first($node)) {
        case 's': return base64_decode($node['s']);
        case 'i': return (int) $node['i'];
        case 'd': return (float) $node['d'];
        case 'b': return (bool) $node['b'];
        case 'n': return null;
        case 'l': return array_map('build', $node['l']);
        case 'm':
            $out = [];
            foreach ($node['m'] as [$key, $value]) $out[base64_decode($key)] = build($value);
            return $out;
    }
    throw new Exception('bad node');
}

require __DIR__ . '/xml-mapping.php';

$corpus = json_decode(file_get_contents($argv[1]), true, 512, JSON_THROW_ON_ERROR);
$results = [];
foreach ($corpus as $entry) {
    $value = build($entry['value']);
    $xml = simplexml_load_string(base64_decode($entry['xml']));
    $results[] = [
        'json' => base64_encode(json_encode($value, JSON_THROW_ON_ERROR)),
        'jsonu' => base64_encode(json_encode($value, JSON_UNESCAPED_UNICODE | JSON_THROW_ON_ERROR)),
        'serialize' => base64_encode(serialize($value)),
        'var_export' => base64_encode(var_export($value, true)),
        'xml_reads_back' => $xml !== false && xml_map($xml) === $value,
    ];
}
echo json_encode($results);
