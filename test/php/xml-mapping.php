<?php
// Reads a document of the gateway's XML mapping (README, "The XML mapping")
// back into the PHP array it stands for.

function xml_value(SimpleXMLElement $e) {
    switch ((string) $e['type']) {
        case 'int': return (int) (string) $e;
        case 'float': return (float) (string) $e;
        case 'bool': return (string) $e === 'true';
        case 'null': return null;
        case 'list':
            $out = [];
            foreach ($e->children() as $child) $out[] = xml_value($child);
            return $out;
        case 'map': return xml_map($e);
        default:
            $s = (string) $e;
            return (string) $e['encoding'] === 'base64' ? base64_decode($s) : $s;
    }
}

function xml_map(SimpleXMLElement $e): array {
    $out = [];
    foreach ($e->children() as $name => $child) {
        $key = isset($child['key-base64']) ? base64_decode((string) $child['key-base64'])
            : (isset($child['key']) ? (string) $child['key'] : $name);
        $out[$key] = xml_value($child);
    }
    return $out;
}
